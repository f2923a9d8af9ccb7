"""One local stochastic gradient descent-ascent step, shared by every backend.

    v  ← v − η · ( clip(∇_v F(v, α; z)) + λ_wd · v + γ · (v − v_ref) + corr_v )
    α  ← Π( α + η_α · ( ∇_α F(v, α; z) + corr_α ) )      (η_α = ``dual_lr``, η if None)

``corr`` is CODASCA's control-variate correction (c − c_k); ``γ (v − v_ref)`` is the proximal
term of CODA+/CODASCA's stage subproblem (eq. 5); clipping (elementwise, network weights only)
and weight decay follow the reference code. All updates use fused ``torch._foreach`` ops so a
step costs little more than a plain ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from fed_auc.trainable import WEIGHT, Trainable


@dataclass(frozen=True)
class StepRule:
    lr: float
    weight_decay: float = 0.0
    grad_clip: float | None = None
    prox_weight: float = 0.0
    dual_lr: float | None = None  # α's step size; None = ``lr`` (the papers' single step)


def primal_direction(
    trainable: Trainable,
    grads: list[torch.Tensor],
    rule: StepRule,
    prox_ref: list[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """The primal descent direction ∇_v F^s without the control-variate correction (in place)."""
    primal = list(trainable.primal.values())
    if rule.grad_clip is not None:
        network = [
            g for name, g in zip(trainable.primal, grads, strict=True) if name.startswith(WEIGHT)
        ]
        torch._foreach_clamp_min_(network, -rule.grad_clip)
        torch._foreach_clamp_max_(network, rule.grad_clip)
    prox = rule.prox_weight if prox_ref is not None else 0.0
    if rule.weight_decay or prox:  # λ_wd·v + γ·(v − v_ref), without temporaries
        torch._foreach_add_(grads, primal, alpha=rule.weight_decay + prox)
    if prox:
        torch._foreach_add_(grads, prox_ref, alpha=-prox)
    return grads


@torch.no_grad()
def _apply(
    trainable: Trainable,
    primal_dir: list[torch.Tensor],
    dual_dir: list[torch.Tensor],
    lr: float,
    dual_lr: float | None = None,
) -> None:
    torch._foreach_add_(list(trainable.primal.values()), primal_dir, alpha=-lr)
    if dual_dir:
        dual = lr if dual_lr is None else dual_lr
        torch._foreach_add_(list(trainable.dual.values()), dual_dir, alpha=dual)
        trainable.project_()


def sgda_step(
    trainable: Trainable,
    batch: Sequence[torch.Tensor],
    rule: StepRule,
    prox_ref: list[torch.Tensor] | None = None,
    correction: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> float:
    """One SGDA step on a batch as drawn ((x, y) or a ``Batch`` with row weights); returns
    the batch loss."""
    value, primal_grads, dual_grads = trainable.gradients(*batch)
    with torch.no_grad():
        primal_dir = primal_direction(trainable, primal_grads, rule, prox_ref)
        if correction is not None:
            torch._foreach_add_(primal_dir, correction[0])
            if dual_grads:
                torch._foreach_add_(dual_grads, correction[1])
    _apply(trainable, primal_dir, dual_grads, rule.lr, rule.dual_lr)
    return float(value)


def run_local_steps(
    trainable: Trainable,
    batches: Iterator[Sequence[torch.Tensor]],
    steps: int,
    rule: StepRule,
    prox_ref: list[torch.Tensor] | None = None,
    correction: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    iterate_sum: list[torch.Tensor] | None = None,
) -> tuple[float, int]:
    """``steps`` SGDA steps; returns (mean batch loss, steps done).

    ``iterate_sum``, if given, accumulates Σ_t (v_t, α_t) over t = 1..steps, in primal-then-dual
    order, for stage outputs that average iterates (CODA+).
    """
    params = list(trainable.primal.values()) + list(trainable.dual.values())
    trainable.model.train()
    total = 0.0
    for done in range(steps):
        batch = next(batches, None)
        if batch is None:
            raise RuntimeError(f"the batch stream ended after {done} of {steps} local steps")
        total += sgda_step(trainable, batch, rule, prox_ref, correction)
        if iterate_sum is not None:
            with torch.no_grad():
                torch._foreach_add_(iterate_sum, params)
    return total / steps, steps

"""Example-level DP-SGD on a node: clipped per-example gradients plus Gaussian noise.

Every local gradient a backend asks for (``Trainable.gradients``, ``dual_gradients_at``)
becomes, while a node trains with ``dp = "example"``,

    ĝ = ( Σ_i clip_C(g_i) + N(0, σ²C² I) ) / m,     clip_C(g) = g · min(1, C / ‖g‖),

with g_i the gradient of example i's own loss w.r.t. everything trained: the network, a, b
AND α, clipped jointly as one vector, so example i moves (w, a, b, α) by at most C in total;
m = the expected batch size (Poisson batches) or the chunk size (full passes). Everything a
backend does with ĝ (elementwise clip, weight decay, proximal term, control variates,
momentum, normalization, averaging) is post-processing: no further privacy cost.

Per-example terms of the AUC losses. Given (a, b, α, p), with p the global prevalence (a
public count), the loss of a batch is the mean over its rows of the loss of the row alone:
(1−p)(h−a)²·[y=1] + p(h−b)²·[y=0] + 2α(p·h·[y=0] − (1−p)·h·[y=1]) plus α's own terms
(2αp(1−p)m − p(1−p)α² for AUC-M) that every row carries. So g_i is the gradient of the
loss of the one-row batch {i} (computed with the loss module itself), including α's
data-independent part, times the row's sampling weight (``Batch.weights``: a constant per
class, fixed by the sampler's rates, so it does not make one row's term depend on another).
(With several labels and unknown entries the batch loss divides each
label by its own known rows; DP-SGD uses the plain mean over rows, which weights a row's
labels by 1/m instead.) Fed-SGDA's label-weighted full passes are refused here.

Per-example gradients: the network's by ``torch.func.vmap`` over ``grad`` of the row's logit
times ∂ℓ_i/∂logit (the chain rule, one vmapped backward), the loss's by autograd on each
one-row loss. BatchNorm mixes the rows of a batch, so DP needs GroupNorm (``models.norm``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call, grad, vmap

from fed_auc.algorithms.base import Draw, validate_positive
from fed_auc.data.poisson import PoissonBatches
from fed_auc.exchange import Broadcast, Reply
from fed_auc.privacy.accounting import (
    NodeSecret,
    PrivacyLedger,
    Step,
    check_delta,
    check_plan,
    example_plan,
    noise_for_plan,
)
from fed_auc.privacy.update_dp import DATA_METRICS
from fed_auc.trainable import AUC, WEIGHT, Tensors, Trainable, batch_loss, full_precision

DP_MODES = ("update", "example")


@dataclass(frozen=True)
class ExampleDP:
    """DP-SGD's settings: clip norm C, noise multiplier σ and/or a target ε, δ, and what the
    planner plans for: ``rounds`` rounds of at most ``local_steps`` local steps (a site's own
    local steps replace it). Only σ: no cap. Only ε: σ calibrated so the planned run spends
    it. Both: σ as given, and a run whose plan needs more than ε is refused before round 1."""

    clip: float
    noise_multiplier: float | None = None
    delta: float = 1e-5
    target_epsilon: float | None = None
    rounds: int = 1
    local_steps: int = 1

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        check_delta(self.delta)
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("dp = 'example' needs dp_noise (σ) or target_epsilon (ε), got neither")
        if self.noise_multiplier is not None:
            validate_positive("dp_noise", self.noise_multiplier)
        if self.target_epsilon is not None:
            validate_positive("target_epsilon", self.target_epsilon)
        for name in ("rounds", "local_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"DP planning: {name} must be an integer ≥ 1, got {value!r}")


class DrawLog:
    """The batches drawn during one local update and how often each was evaluated."""

    def __init__(self, key: str = "") -> None:
        self.key = key  # the release this update makes (accounting.release_key)
        self.draws: list[list[Any]] = []  # [q, normalizer, evaluations, pass id or None]

    def draw(self, q: float, normalizer: float) -> None:
        self.draws.append([q, normalizer, 0, None])

    def chunk(self, pass_id: int, normalizer: float) -> None:
        self.draws.append([1.0, normalizer, 0, pass_id])

    def evaluated(self) -> float:
        """Count one private evaluation on the latest draw; its normalizer m."""
        if not self.draws:
            raise RuntimeError("a private gradient on data not drawn by the node's sampler")
        self.draws[-1][2] += 1
        return self.draws[-1][1]

    def steps(self, sigma: float) -> list[Step]:
        """The accountant's steps: a batch evaluated k times is one step at σ/√k; a full
        pass is one step at q = 1 with k its chunks' most evaluations."""
        out, passes = [], {}
        for q, _, k, pass_id in self.draws:
            if k and pass_id is None:
                out.append(Step(q, sigma / math.sqrt(k)))
            elif k:
                passes[pass_id] = max(passes.get(pass_id, 0), k)
        out += [Step(1.0, sigma / math.sqrt(k)) for k in passes.values()]
        return out


class PrivateGradients:
    """The clipped, noised gradients of one local update (set as ``Trainable.private``)."""

    def __init__(self, clip: float, sigma: float, log: DrawLog, generator: torch.Generator):
        self.clip, self.sigma, self.log, self.generator = clip, sigma, log, generator

    def __deepcopy__(self, memo: dict) -> PrivateGradients:
        return self  # a copied Trainable (FedSGDA's anchor) shares the log and the noise

    def gradients(
        self,
        trainable: Trainable,
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor | None = None,
        label_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(batch loss, private gradients of the primal then dual block)."""
        if label_weights is not None:
            raise ValueError(
                "dp = 'example' cannot weight full-pass chunks by label (several labels with "
                "unknown entries under FedSGDA); use single-label data or another backend"
            )
        names = [*trainable.primal, *trainable.dual]
        value, per_example = per_example_gradients(trainable, x, y, names, row_weights=row_weights)
        return value, self._privatize(per_example)

    def dual_gradients_at(
        self,
        trainable: Trainable,
        point: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """α's private gradient with the primal block at ``point`` (Fed-Norm-SGDA+)."""
        names = list(trainable.dual)
        _, per_example = per_example_gradients(trainable, x, y, names, point, row_weights)
        return self._privatize(per_example)

    def _privatize(self, per_example: list[torch.Tensor]) -> list[torch.Tensor]:
        normalizer = self.log.evaluated()
        with torch.no_grad():
            scale = clip_factors(per_example, self.clip)
            out = []
            for g in per_example:
                summed = torch.einsum("b,b...->...", scale.to(g.dtype), g)
                # drawn on the CPU, so the noise is the same on every device
                noise = torch.randn(summed.shape, generator=self.generator, dtype=summed.dtype)
                noise = noise.to(summed.device)
                out.append((summed + noise * (self.sigma * self.clip)) / normalizer)
            return out


def clip_factors(per_example: list[torch.Tensor], clip: float) -> torch.Tensor:
    """min(1, C / ‖g_i‖) per example, ‖g_i‖ over all its tensors jointly."""
    squares = sum(g.flatten(start_dim=1).double().pow(2).sum(dim=1) for g in per_example)
    norms = squares.sqrt()
    return torch.where(norms > clip, clip / norms.clamp(min=1e-300), torch.ones_like(norms))


def per_example_gradients(
    trainable: Trainable,
    x: torch.Tensor,
    y: torch.Tensor,
    names: list[str],
    point: Tensors | None = None,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(mean of the rows' losses, one (B, *shape) gradient per name): row i's gradient is
    that of the loss of the one-row batch {i}, weighted as ``batch_loss`` weights it.
    ``point``: primal values to use instead of the current ones (names ``w/…``, ``auc/…``)."""
    model, loss = trainable.model, trainable.loss
    moved = {n: t for n, t in (point or {}).items() if n in trainable.primal}
    values = {**trainable.primal, **trainable.dual, **moved}
    weights = {
        n[len(WEIGHT) :]: values[n].detach() for n in trainable.primal if n.startswith(WEIGHT)
    }
    loss_vars = {n[len(AUC) :]: values[n].detach() for n in values if n.startswith(AUC)}
    rows = len(x)
    shapes = {n: values[n].shape for n in names}
    if rows == 0:  # an empty Poisson batch: only noise will be released
        return torch.zeros((), device=x.device), [x.new_zeros((0, *shapes[n])) for n in names]
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ValueError(
            "dp = 'example' needs a model without BatchNorm (it mixes the rows of a batch): "
            "build it with norm='group'"
        )
    with torch.no_grad():
        logits = full_precision(functional_call(model, weights, (x,)))
    # The loss of each one-row batch and its gradient w.r.t. the row's logits and (a, b, α).
    upstream = torch.empty_like(logits)
    leaves = {k: v.clone().requires_grad_(True) for k, v in loss_vars.items()}
    loss_grads = {k: v.new_empty((rows, *v.shape)) for k, v in leaves.items()}
    total = logits.new_zeros(())
    for i in range(rows):
        row = logits[i : i + 1].clone().requires_grad_(True)
        weight = None if row_weights is None else row_weights[i : i + 1]
        value = batch_loss(loss, row, y[i : i + 1], weight, leaves)
        found = torch.autograd.grad(value, [row, *leaves.values()], allow_unused=True)
        upstream[i] = found[0][0]
        for (k, leaf), g in zip(leaves.items(), found[1:], strict=True):
            loss_grads[k][i] = g if g is not None else torch.zeros_like(leaf)
        total += value.detach()
    wanted = [n[len(WEIGHT) :] for n in names if n.startswith(WEIGHT)]
    network: dict[str, torch.Tensor] = {}
    if wanted:
        trained = {k: weights[k] for k in wanted}

        def weighted_logit(params, xi, ui):
            return (functional_call(model, params, (xi.unsqueeze(0),))[0] * ui).sum()

        network = vmap(grad(weighted_logit), in_dims=(None, 0, 0))(trained, x, upstream)
    grads = [
        network[n[len(WEIGHT) :]] if n.startswith(WEIGHT) else loss_grads[n[len(AUC) :]]
        for n in names
    ]
    return total / rows, grads


class PrivateTraining:
    """A node's DP-SGD: its sampler, plan, σ, ledger and budget; wraps each local update.
    ``draws``: what one round draws from the data (every phase's ``Backend.private_draws``,
    plus a personal model's steps); the noise comes from ``secret``, the node's own."""

    def __init__(
        self,
        dp: ExampleDP,
        site: str,
        batches: PoissonBatches,
        state_dir,
        secret: NodeSecret,
        draws: list[Draw],
    ) -> None:
        self.dp, self.site, self.batches, self.secret = dp, site, batches, secret
        self.plan = example_plan(draws, batches.sample_rate, dp.rounds)
        given = dp.noise_multiplier
        self.sigma = (
            given if given is not None else noise_for_plan(dp.target_epsilon, dp.delta, self.plan)
        )
        self.planned_epsilon = check_plan(
            self.plan, self.sigma, dp.delta, dp.target_epsilon, site, dp.rounds
        )
        self.ledger = PrivacyLedger(state_dir, dp.delta)

    def check_open(self) -> None:
        """Raise ``BudgetSpent`` if an earlier round found the budget spent."""
        self.ledger.check_open(self.dp.target_epsilon)

    @contextmanager
    def update(self, trainable: Trainable, key: str) -> Iterator[DrawLog]:
        """Private gradients for one ``client_update`` (the release ``key``); the noise is
        drawn from the node's secret, keyed by the release."""
        log = DrawLog(key)
        generator = torch.Generator().manual_seed(self.secret.seed("noise", key))
        trainable.private = PrivateGradients(self.dp.clip, self.sigma, log, generator)
        self.batches.log = log
        try:
            yield log
        finally:
            trainable.private = None
            self.batches.log = None

    def release(self, reply: Reply, broadcast: Broadcast, log: DrawLog) -> Reply:
        """Count the release, or refuse it (``BudgetSpent``) if it would pass the target."""
        steps = log.steps(self.sigma)
        self.ledger.spend(log.key, broadcast.round, broadcast.phase, steps, self.dp.target_epsilon)
        metrics = {k: v for k, v in reply.metrics.items() if k not in DATA_METRICS}
        metrics.update(
            dp_epsilon=self.ledger.epsilon(),
            dp_delta=self.dp.delta,
            dp_noise_multiplier=self.sigma,
            dp_sample_rate=self.batches.sample_rate,
        )
        reply.metrics = metrics
        return reply

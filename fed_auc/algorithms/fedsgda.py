"""FedSGDA (Xie, Zhang, Zhang, Qian, Shen): two-phase federated SGDA with a fresh global
gradient estimate every round; MB and STORM estimators. x = (w, a, b), y = α.

Framework 1 (server), round t; z̄_{−1} = z̄_0, S'_t and S_t independent samples:
    gradient collection (phase "collect"):
        send z̄_t (and z̄_{t−1}, STORM) to S'_t
        receive ∇f_i(z̄_t) (and ∇f_i(z̄_{t−1}), STORM) from i ∈ S'_t  — FULL local gradients
        (u_t, v_t) ← estimator E                                                  (§4.2)
    parameter update (phase "update"):
        send (u_t, v_t) and z̄_t to S_t
        receive z_{t,i}^{(K)} from i ∈ S_t
        z̄_{t+1} ← (1/|S_t|) Σ_{i∈S_t} z_{t,i}^{(K)}       (Framework 1 line 9; no server step)

Framework 2 (client, collect): compute ∇f_i at z̄_t (and z̄_{t−1}); send them.

Framework 3 (client, update): z^{(0)} ← z̄_t; for k = 0..K−1, one minibatch B^{(k)}:
    d_x = ∇_x F_i(z^{(k)}; B) − ∇_x F_i(z̄_t; B) + u_t                             (§4.1)
    d_y = ∇_y F_i(z^{(k)}; B) − ∇_y F_i(z̄_t; B) + v_t
    x^{(k+1)} = x^{(k)} − η_t d_x,   y^{(k+1)} = y^{(k)} + γ_t d_y          (simultaneous)
send z^{(K)}.  At k = 0 the minibatch terms cancel: d^{(0)} = (u_t, v_t) exactly.

Estimators (§4.2, App. B), means over the collect responders S'_t for u AND v (the
paper's S_t in v_t is a typo; the proofs use S'_t):
    MB:    (u_t, v_t) = mean_{S'_t} ∇f_i(z̄_t)
    STORM: u_t = (1 − α_t)(u_{t−1} − mean_{S'_t} ∇_x f_i(z̄_{t−1})) + mean_{S'_t} ∇_x f_i(z̄_t)
           v_t likewise with β_t;   u_0, v_0 = MB.
Schedules (App. D.1, t = round): η_t = c_η/(t+1)^ρ, γ_t = c_γ/(t+1)^ρ,
α_t = β_t = min(1, c_α/(t+1)^{2ρ}).

Choices the paper leaves open:
- Full local gradient: the loss is a per-example mean, so chunks of ``full_pass`` are
  combined weighted by chunk size. BatchNorm runs in train mode (batch statistics per
  chunk), the mode of the local steps whose anchor terms u_t stands in for; running
  statistics touched by these passes are restored, and the collect phase sends no buffers.
- Anchor gradient ∇F_i(z̄_t; B): a deep copy of the node's Trainable at z̄_t, made once per
  round, kept warm for the K steps: no per-step parameter swapping, works for any object
  with the Trainable members, and its BatchNorm statistics are discarded with it. The
  models have no dropout, so both passes on B are the same function of the batch.
- Weight decay λ is part of the objective (F + λ/2‖x‖²): clients add λx̄ to the full
  gradient, and both minibatch gradients get λx, so it appears as λ(x^{(k)} − x̄_t).
  Clipping (elementwise, network weights) applies to both minibatch gradients identically,
  never to the full gradient. Either way d^{(0)} = (u_t, v_t), K = 1 is a server GDA step
  and STORM with α = 1 is MB. The paper has neither, hence defaults 0 and None.
- α is projected on the local iterate after every step, as in the other backends; the
  average of feasible iterates is feasible. Server means follow ``site_weighting`` in both
  phases (uniform = the paper's D).
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from collections.abc import Mapping, Sequence

import torch

from fed_auc.algorithms.base import (
    Backend,
    Batches,
    Broadcast,
    LocalState,
    Reply,
    ReplyLayout,
    ServerState,
    model_part,
    prefixed,
    scaled_norm,
    site_weights,
    unprefixed,
    validate_positive,
    weighted_mean,
)
from fed_auc.algorithms.sgda import StepRule, primal_direction
from fed_auc.trainable import BUFFER, Tensors, Trainable

PREVIOUS = "prev/"  # z̄_{t−1}, sent in the STORM collect phase
GRADIENT = "g/"  # a site's full local gradient at z̄_t
GRADIENT_PREVIOUS = "gprev/"  # ... and at z̄_{t−1} (STORM)
ESTIMATE = "u/"  # the global estimate (u_t, v_t)


def _variables(tensors: Tensors) -> Tensors:
    """Primal and dual tensors of a model payload (everything but buffers)."""
    return {n: t for n, t in model_part(tensors).items() if not n.startswith(BUFFER)}


def full_gradient(
    trainable: Trainable, batches: Batches, weight_decay: float
) -> tuple[float, Tensors]:
    """∇f_i at the loaded point over all local examples, plus λx (Framework 2).

    ``batches`` must offer ``full_pass()`` (``BatchStream``), which leaves the stream as is.

    Chunk means are weighted by chunk size, so the result is the mean over all n_i rows.
    """
    names = [*trainable.primal, *trainable.dual]
    total, loss, acc = 0, 0.0, None
    trainable.model.train()
    for x, y in batches.full_pass():
        value, primal_grads, dual_grads = trainable.gradients(x, y)
        grads, size = primal_grads + dual_grads, len(x)
        with torch.no_grad():
            if acc is None:
                acc = torch._foreach_mul(grads, float(size))
            else:
                torch._foreach_add_(acc, grads, alpha=size)
        loss += float(value) * size
        total += size
    if acc is None:
        raise RuntimeError("the full pass over the local training split yielded no rows")
    with torch.no_grad():
        torch._foreach_div_(acc, float(total))
        if weight_decay:
            primal = acc[: len(trainable.primal)]
            torch._foreach_add_(primal, list(trainable.primal.values()), alpha=weight_decay)
    return loss / total, dict(zip(names, acc, strict=True))


class _FedSGDA(Backend):
    """Frameworks 1–3; subclasses supply the estimator E."""

    phases = ("collect", "update")
    uses_previous = False  # whether E needs ∇f_i(z̄_{t−1})

    def __init__(
        self,
        dual_lr: float | None = None,
        decay_power: float = 0.0,
        lr_decay: float = 1.0,
        weight_decay: float = 0.0,
        grad_clip: float | None = None,
        **common,
    ) -> None:
        super().__init__(
            lr_decay=lr_decay, weight_decay=weight_decay, grad_clip=grad_clip, **common
        )
        if dual_lr is not None:
            validate_positive("dual_lr", dual_lr)
        validate_positive("decay_power", decay_power, allow_zero=True)
        self.dual_lr = self.lr if dual_lr is None else dual_lr
        self.decay_power = decay_power

    def step_sizes(self, round_: int) -> tuple[float, float]:
        """(η_t, γ_t) = (c_η, c_γ)/(t+1)^ρ, times the base's stagewise decay (1 by default)."""
        stage = self.lr_of(round_) / self.lr
        shrink = (round_ + 1) ** self.decay_power
        return self.lr * stage / shrink, self.dual_lr * stage / shrink

    def reply_layout(self, phase: str = "train") -> ReplyLayout:
        if phase == "collect":
            prefixes = (GRADIENT, GRADIENT_PREVIOUS) if self.uses_previous else (GRADIENT,)
            return ReplyLayout(prefixes=prefixes, buffers=False)
        return ReplyLayout()

    def update_norm(self, reply: Reply, request: Broadcast) -> float | None:
        """Update phase: ‖z_i^(K) − z̄_t‖. Collect phase: a full gradient moves every client
        of the next update phase through (u_t, v_t), by η_t (γ_t for α) per local step, so
        each gradient block (∇f_i(z̄_t), and ∇f_i(z̄_{t−1}) for STORM) is bounded as the move
        of K = ``local_steps`` such steps, ‖(K η_t g_x, K γ_t g_y)‖; the larger block counts."""
        if request.phase != "collect":
            return super().update_norm(reply, request)
        eta, gamma = self.step_sizes(request.round)
        k = self.local_steps
        prefixes = (GRADIENT, GRADIENT_PREVIOUS) if self.uses_previous else (GRADIENT,)
        norms = [
            scaled_norm(unprefixed(prefix, reply.tensors), k * eta, k * gamma)
            for prefix in prefixes
        ]
        return max((n for n in norms if n is not None), default=None)

    # -- server -------------------------------------------------------------------------
    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        model = trainable.tensors()
        return {
            "round": 0,
            "model": model,
            "previous": _variables(model),  # z̄_{−1} = z̄_0
            "estimate": None,  # (u_{t−1}, v_{t−1}), then (u_t, v_t) after collect
        }

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        if phase == "collect":  # Framework 1 line 3
            tensors = _variables(state["model"])
            if self.uses_previous:
                tensors.update(prefixed(PREVIOUS, state["previous"]))
            return Broadcast(round_, phase, tensors, {})
        eta, gamma = self.step_sizes(round_)  # line 7
        tensors = {**state["model"], **prefixed(ESTIMATE, state["estimate"])}
        config = {"lr": eta, "dual_lr": gamma, "local_steps": self.local_steps}
        return Broadcast(round_, phase, tensors, config)

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        weights = site_weights(replies, self.site_weighting)
        if phase == "collect":  # lines 4–5
            current = weighted_mean([unprefixed(GRADIENT, r.tensors) for r in replies], weights)
            previous = None
            if self.uses_previous:
                grads = [unprefixed(GRADIENT_PREVIOUS, r.tensors) for r in replies]
                previous = weighted_mean(grads, weights)
            return {**state, "estimate": self.estimate(state, current, previous)}
        averaged = weighted_mean([model_part(r.tensors) for r in replies], weights)  # line 9
        model = {**state["model"], **averaged}  # a tensor nobody trained keeps its value
        return {
            **state,
            "round": state["round"] + 1,
            "model": model,
            "previous": _variables(state["model"]),
        }

    @abstractmethod
    def estimate(self, state: ServerState, current: Tensors, previous: Tensors | None) -> Tensors:
        """(u_t, v_t) from the responders' mean gradients at z̄_t and z̄_{t−1}."""

    # -- client -------------------------------------------------------------------------
    def client_update(
        self,
        broadcast: Broadcast,
        local_state: LocalState,
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState]:
        if broadcast.phase == "collect":
            return self._collect(broadcast, trainable, batches), local_state
        return self._update(broadcast, trainable, batches), local_state

    def _collect(self, broadcast: Broadcast, trainable: Trainable, batches: Batches) -> Reply:
        """Framework 2; the node's BatchNorm statistics come out as they went in."""
        saved = {n: b.detach().clone() for n, b in trainable.buffers.items()}
        trainable.load(model_part(broadcast.tensors))
        loss, grads = full_gradient(trainable, batches, self.weight_decay)
        tensors = prefixed(GRADIENT, grads)
        if self.uses_previous:
            trainable.load(unprefixed(PREVIOUS, broadcast.tensors))
            _, grads = full_gradient(trainable, batches, self.weight_decay)
            tensors.update(prefixed(GRADIENT_PREVIOUS, grads))
        trainable.load(saved)
        return Reply(tensors, steps=0, metrics={"train_loss": loss})

    def _update(self, broadcast: Broadcast, trainable: Trainable, batches: Batches) -> Reply:
        """Framework 3 with the corrected direction of §4.1."""
        trainable.load(model_part(broadcast.tensors))
        anchor = copy.deepcopy(trainable)  # z̄_t for the whole round
        estimate = unprefixed(ESTIMATE, broadcast.tensors)
        u = [estimate[n] for n in trainable.primal]
        v = [estimate[n] for n in trainable.dual]
        primal, dual = list(trainable.primal.values()), list(trainable.dual.values())
        eta, gamma = broadcast.config["lr"], broadcast.config["dual_lr"]
        rule = StepRule(eta, self.weight_decay, self.grad_clip)
        steps = broadcast.config["local_steps"]
        trainable.model.train()
        anchor.model.train()
        total = 0.0
        for done in range(steps):
            batch = next(batches, None)  # B_{t,i}^{(k)}, used at z^{(k)} and at z̄_t
            if batch is None:
                raise RuntimeError(f"the batch stream ended after {done} of {steps} local steps")
            value, gx, gy = trainable.gradients(*batch)
            _, ax, ay = anchor.gradients(*batch)
            with torch.no_grad():
                d_x = torch._foreach_sub(
                    primal_direction(trainable, gx, rule, None),
                    primal_direction(anchor, ax, rule, None),
                )
                torch._foreach_add_(d_x, u)
                torch._foreach_add_(primal, d_x, alpha=-eta)  # descent
                if dual:
                    d_y = torch._foreach_sub(gy, ay)
                    torch._foreach_add_(d_y, v)
                    torch._foreach_add_(dual, d_y, alpha=gamma)  # ascent
                    trainable.project_()
            total += float(value)
        return Reply(trainable.tensors(), steps=steps, metrics={"train_loss": total / steps})


class FedSGDAMB(_FedSGDA):
    """FedSGDA-MB: (u_t, v_t) is the mean full gradient of this round's responders.

    Constant step sizes by default (ρ = 0, Theorem 1); converges to an O(σ²/S) neighbourhood.
    """

    name = "fedsgda_mb"

    def estimate(self, state: ServerState, current: Tensors, previous: Tensors | None) -> Tensors:
        return current  # §4.2 (a)


class FedSGDASTORM(_FedSGDA):
    """FedSGDA-STORM: momentum-based variance reduction across rounds (§4.2 (b)).

    ``storm_c`` = c_α; ρ defaults to 1/5, the value selected in the paper's AUC runs.
    """

    name = "fedsgda_storm"
    uses_previous = True

    def __init__(self, storm_c: float = 1.0, decay_power: float = 0.2, **kwargs) -> None:
        super().__init__(decay_power=decay_power, **kwargs)
        validate_positive("storm_c", storm_c)
        self.storm_c = storm_c

    def momentum(self, round_: int) -> float:
        """α_t = β_t = min(1, c_α/(t+1)^{2ρ})."""
        return min(1.0, self.storm_c / (round_ + 1) ** (2 * self.decay_power))

    def estimate(self, state: ServerState, current: Tensors, previous: Tensors | None) -> Tensors:
        if state["estimate"] is None:  # t = 0: u_0, v_0 = MB
            return current
        keep = 1.0 - self.momentum(state["round"])
        return {  # (1 − α_t)(u_{t−1} − ḡ(z̄_{t−1})) + ḡ(z̄_t)
            n: keep * (u - previous[n]) + current[n] for n, u in state["estimate"].items()
        }

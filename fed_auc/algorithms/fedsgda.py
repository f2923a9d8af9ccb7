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
Under client sampling, MB with a constant step reaches a neighbourhood of the saddle point of
size ∝ σ²/S (Thm 1; σ² includes the sites' heterogeneity); a decaying step converges (toy, 3 of
6 sites: ρ = 1 within 0.01 after 1600 rounds, STORM ρ = 0.5 after 800; BENCHMARKS.md).
Site gradients do not vanish at the saddle point (only their mean does): update-level DP
clipping and robust clipping of the collect replies would move the fixed point, so both are
refused (``refuses_update_dp``, ``refuses_robust_aggregation``).

Choices the paper leaves open:
- Full local gradient: that of one chunk holding the whole split, whatever the chunks of
  ``full_pass``: chunks weighted by size, or per label by their share of the label's known
  rows when labels are missing (NaN). BatchNorm runs in train mode (batch statistics per
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
- Partial training (weak sites send only an output-side suffix): every mean is taken per
  variable over the sites that sent it. A variable that no collect responder measured (a
  collect answered by weak sites only) has no estimate in round t: it does not move on any
  site that round, and STORM restarts it from the MB estimate when next measured.
- Secure aggregation: both phases are per-variable weighted means, so both run from sums
  (``aggregate_secure``); the collect phase's gradients are masked like iterates.
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
    Draw,
    LocalState,
    SecureTotal,
    ServerState,
    model_part,
    prefixed,
    site_weights,
    unprefixed,
    validate_numeric_dual_lr,
    validate_positive,
    weighted_mean,
)
from fed_auc.algorithms.sgda import StepRule, primal_direction
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
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

    The result is that of one chunk holding every row, whatever the chunks. With every label
    known, chunk means are weighted by chunk size. With unknown (NaN) labels the AUC losses
    divide each label's sum by ITS known rows, so a chunk's label l is weighted by its share
    of label l's known rows over the split, n_cl / N_l (the cross-entropy divides by all
    known entries: n_cl / Σ_l N_l); a first pass over the labels counts them.
    """
    names = [*trainable.primal, *trainable.dual]
    labels = [y for _, y in batches.full_pass()]
    if not labels:
        raise RuntimeError("the full pass over the local training split yielded no rows")
    missing = any(bool(torch.isnan(y).any()) for y in labels)
    if missing:
        known = sum((~torch.isnan(y)).sum(dim=0) for y in labels).double()
        denominators = known if trainable.is_minimax else known.sum().expand_as(known)
    total = 1.0 if missing else 0.0  # the weights' sum: the shares sum to 1 per label
    loss, acc = 0.0, None
    trainable.model.train()
    for x, y in batches.full_pass():
        if missing:
            share = (~torch.isnan(y)).sum(dim=0).double() / denominators.clamp(min=1)
            if not share.any():
                continue  # no known label in this chunk: it adds nothing
            value, primal_grads, dual_grads = trainable.gradients(x, y, label_weights=share)
            size = 1.0
        else:
            value, primal_grads, dual_grads = trainable.gradients(x, y)
            size = len(x)
            total += size
        grads = primal_grads + dual_grads
        with torch.no_grad():
            if acc is None:
                acc = torch._foreach_mul(grads, float(size))
            else:
                torch._foreach_add_(acc, grads, alpha=size)
        loss += float(value) * size
    if acc is None:
        raise RuntimeError("the full pass over the local training split has no known label")
    with torch.no_grad():
        torch._foreach_div_(acc, float(total))
        if weight_decay:
            primal = acc[: len(trainable.primal)]
            torch._foreach_add_(primal, list(trainable.primal.values()), alpha=weight_decay)
    return loss / total, dict(zip(names, acc, strict=True))


class _FedSGDA(Backend):
    """Frameworks 1–3; subclasses supply the estimator E."""

    prevalence_dual_step = False  # α's step is its own rule (validate_numeric_dual_lr)
    phases = ("collect", "update")
    uses_previous = False  # whether E needs ∇f_i(z̄_{t−1})
    # The collect phase's full local gradients do not vanish at the saddle point when sites
    # differ (only their mean does): any clip that binds on them moves the fixed point.
    refuses_robust_aggregation = (
        "its collect phase sends each site's full local gradient, which does not vanish at "
        "the saddle point when sites differ (only the mean does): clipping it around the "
        "median moves the fixed point (toy: 0.42 from the saddle point with "
        "centered_clip:1; each gradient moves the model by Kη‖∇f_i‖ = 1.8–3.4 there); "
        "bound hostile replies with max_update_norm (they are rejected)"
    )
    refuses_update_dp = (
        "its collect phase sends each site's full local gradient, which does not vanish at "
        "the saddle point when sites differ: a clip C below Kη‖∇f_i(z*)‖ moves the fixed "
        "point (toy: 0.46 from the saddle point with dp_clip 0.5), and that norm is unknown "
        "before training"
    )
    refuses_personal_head = "its global gradient estimate covers every tensor"

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
            validate_numeric_dual_lr(self.name, dual_lr)
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

    def private_draws(self, phase: str, local_steps: int) -> list[Draw]:
        """Collect: one full pass per full gradient (two for STORM's ∇f_i(z̄_{t−1})); update:
        each minibatch evaluated at z^{(k)} and at the anchor z̄_t."""
        if phase == "collect":
            return [Draw("pass")] * (2 if self.uses_previous else 1)
        return [Draw("batch", evaluations=2)] * local_steps

    def move_rates(
        self, prefix: str, reply: Reply, request: Broadcast
    ) -> tuple[float, float] | None:
        """Collect phase: a full gradient moves every client of the next update phase through
        (u_t, v_t), by η_t (γ_t for α) per local step, so each gradient block (∇f_i(z̄_t), and
        ∇f_i(z̄_{t−1}) for STORM) moves the model as K = ``local_steps`` such steps would:
        rates (K η_t, K γ_t). Update phase: iterates."""
        if request.phase != "collect":
            return None
        eta, gamma = self.step_sizes(request.round)
        return self.local_steps * eta, self.local_steps * gamma

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

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """Both phases are weighted means (per variable over its senders): from sums."""
        if phase == "collect":
            previous = total.mean(GRADIENT_PREVIOUS) if self.uses_previous else None
            return {**state, "estimate": self.estimate(state, total.mean(GRADIENT), previous)}
        return {
            **state,
            "round": state["round"] + 1,
            "model": {**state["model"], **total.mean()},
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
        # partial training: a variable no collect responder measured has no (u_t, v_t) this
        # round; it stays at z̄_t here (no step), as on the sites that do not train it
        moving = [n in estimate for n in trainable.primal]
        moving_dual = [n in estimate for n in trainable.dual]
        u = [estimate[n] for n in trainable.primal if n in estimate]
        v = [estimate[n] for n in trainable.dual if n in estimate]
        primal = [t for t, m in zip(trainable.primal.values(), moving, strict=True) if m]
        dual = [t for t, m in zip(trainable.dual.values(), moving_dual, strict=True) if m]
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
                d_x = [d for d, m in zip(d_x, moving, strict=True) if m]
                torch._foreach_add_(d_x, u)
                torch._foreach_add_(primal, d_x, alpha=-eta)  # descent
                if dual:
                    gy = [g for g, m in zip(gy, moving_dual, strict=True) if m]
                    ay = [g for g, m in zip(ay, moving_dual, strict=True) if m]
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
        """Per variable; one without u_{t−1} (t = 0, or partial training: no collect
        responder measured it last round) starts over from the MB estimate, as at t = 0."""
        last = state["estimate"] or {}
        keep = 1.0 - self.momentum(state["round"])
        return {  # (1 − α_t)(u_{t−1} − ḡ(z̄_{t−1})) + ḡ(z̄_t)
            n: keep * (last[n] - previous[n]) + g if n in last else g for n, g in current.items()
        }

"""Fed-Norm-SGDA and Fed-Norm-SGDA+ (Sharma, Panda, Joshi: "Federated Minimax Optimization
with Client Heterogeneity", Algorithm 1), on x = (w, a, b) and y = α of the AUC min-max loss.

    Input: x^(0), y^(0); client lrs η_x^c, η_y^c; server lrs γ_x^s, γ_y^s; τ_i^(t); period S
    1  for t = 0..T−1:
    2     server samples C^(t) and sends (x^(t), y^(t))
    3     if t mod S == 0: s ← s + 1;  x̂^(s) = x^(t)                       (+ variant only)
    5     send x̂^(s) to the clients in C^(t)
    6     for each i in C^(t):
    7        x_i^(t,0) = x^(t);  y_i^(t,0) = y^(t)
    8        for k = 0..τ_i^(t)−1:
    9           x_i^(t,k+1) = x_i^(t,k) − η_x^c a_i^(t,k) ∇_x f_i(x_i^(t,k), y_i^(t,k); ξ)
    10          [+] y_i^(t,k+1) = y_i^(t,k) + η_y^c a_i^(t,k) ∇_y f_i(x̂^(s),     y_i^(t,k); ξ)
    11          [ ] y_i^(t,k+1) = y_i^(t,k) + η_y^c a_i^(t,k) ∇_y f_i(x_i^(t,k), y_i^(t,k); ξ)
    13       g_{x,i} = Σ_k (a_i^(t,k) / ‖ā_i‖₁) ∇_x f_i(x_i^(t,k), y_i^(t,k); ξ)
    14/15    g_{y,i} = Σ_k (a_i^(t,k) / ‖ā_i‖₁) ∇_y f_i(x̂^(s) [+] or x_i^(t,k) [ ], y_i^(t,k); ξ)
    16       client sends (g_{x,i}, g_{y,i})
    17    g_x = Σ_{i∈C} w̃_i g_{x,i};  g_y = Σ_{i∈C} w̃_i g_{y,i};  w̃_i = w_i n / |C|    (eq. 3)
    18    x^(t+1) = x^(t) − τ_eff γ_x^s g_x;   y^(t+1) = y^(t) + τ_eff γ_y^s g_y

Normalizing each client's progress by ‖ā_i‖₁ and weighting it by w_i = p_i (not p_i ‖ā_i‖₁, the
implicit weight of averaging iterates) makes heterogeneous τ_i converge to a stationary point
of F = Σ p_i f_i instead of the surrogate F̃ = Σ p_i ‖ā_i‖₁ f_i / Σ_j p_j ‖ā_j‖₁ (Section 3).

Implementation choices, where the paper leaves room:
- The client runs plain or heavy-ball SGDA (buffer reset every round, so ā_i has the closed form
  of Appendix A.1) and sends the pseudo-gradients (x^(t) − x_i^end) / (η_x^c ‖ā_i‖₁) and
  (y_i^end − y^(t)) / (η_y^c ‖ā_i‖₁) under ``g/``, which equal lines 13–15 exactly.
- α is NOT projected during local steps (a clamp would break that linearity); the server clamps
  it to ``dual_min`` after line 18 (outside the paper's theory, like LibAUC's PESG clamp).
- τ_eff: the paper's eq. (2), Σ_{j=1}^n p_j ‖ā_j‖₁ over ALL n sites. The coordinator knows
  every site's τ_j of the round, sampled or not (``with_local_steps``); a site it was not told
  about runs the backend's ``local_steps``. It must not be estimated from the participants:
  Σ_{i∈C} w̃_i ‖ā_i‖₁ and g_x are each unbiased, their product is not (with one of two sites
  sampled, E[τ̂ g] = 2 Σ p_i² ‖ā_i‖₁ g_i, the surrogate F̃ again), and with one site per round
  no estimator of the product is unbiased. A fixed number is the alternative.
- The + variant's snapshot x̂ travels in every round's broadcast (under ``snap/``), so a client
  first sampled mid-window has it too; the paper's line 5 sends it only at refresh rounds.
- BatchNorm buffers are outside the paper: they are averaged with weights p_i over participants.
- All rates decay with the stage like the other backends' lr, so γ^s = η^c stays equal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real

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
    unprefixed,
    validate_choice,
    validate_numeric_dual_lr,
    validate_positive,
    weighted_mean,
)
from fed_auc.algorithms.sgda import StepRule, primal_direction
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.trainable import BUFFER, Tensors, Trainable

GRADIENT = "g/"  # the normalized gradient aggregates (g_x,i, g_y,i) of lines 13–15
SNAPSHOT = "snap/"  # the + variant's x̂^(s)
TAU_EFF_MODES = ("all_sites",)


def momentum_a_norm(steps: int, momentum: float) -> float:
    """‖ā‖₁ of τ heavy-ball steps from a zero buffer (App. A.1): a_k = (1 − ρ^(τ−k)) / (1 − ρ)."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNormSGDA(Backend):
    name = "fed_norm_sgda"
    prevalence_dual_step = False  # α's step is its own rule (validate_numeric_dual_lr)

    def __init__(
        self,
        dual_lr: float | None = None,
        server_lr: float | None = None,
        server_dual_lr: float | None = None,
        momentum: float = 0.0,
        tau_eff: str | float = "all_sites",
        site_weighting: str = "examples",
        **common,
    ) -> None:
        super().__init__(site_weighting=site_weighting, **common)
        if dual_lr is not None:
            validate_numeric_dual_lr(self.name, dual_lr)
        for name, value in (
            ("server_lr", server_lr),
            ("server_dual_lr", server_dual_lr),
        ):
            if value is not None:
                validate_positive(name, value)
        if not (isinstance(momentum, Real) and 0 <= momentum < 1):
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        if isinstance(tau_eff, str):
            validate_choice("tau_eff", tau_eff, TAU_EFF_MODES)
        elif isinstance(tau_eff, bool) or not isinstance(tau_eff, Real):
            raise ValueError(f"tau_eff must be one of {list(TAU_EFF_MODES)} or a number > 0")
        else:
            validate_positive("tau_eff", tau_eff)
        self.dual_lr = dual_lr
        self.server_lr = server_lr
        self.server_dual_lr = server_dual_lr
        self.momentum = float(momentum)
        self.tau_eff = tau_eff

    def reply_layout(self, phase: str = "train") -> ReplyLayout:
        return ReplyLayout(prefixes=(GRADIENT,), buffers=True)

    def check_reply(self, reply: Reply, request: Broadcast) -> None:
        """‖ā_i‖₁ (``a_norm``) scales τ_eff and the step: it must be what ``steps`` heavy-ball
        steps with this momentum give (the client computes it so, Appendix A.1)."""
        a_norm = reply.metrics.get("a_norm")
        if a_norm is None:
            raise ValueError("metric 'a_norm' (‖ā_i‖₁) is missing")
        expected = momentum_a_norm(reply.steps, self.momentum)
        if not math.isclose(a_norm, expected, rel_tol=1e-9):
            raise ValueError(
                f"a_norm = {a_norm:.6g}, but {reply.steps} local steps with momentum "
                f"{self.momentum} give ‖ā_i‖₁ = {expected:.6g}"
            )

    def move_rates(
        self, prefix: str, reply: Reply, request: Broadcast
    ) -> tuple[float, float] | None:
        """The step line 18 takes if this reply alone is aggregated, with τ_eff its own ‖ā_i‖₁
        (or the fixed τ_eff): rates (τ_eff γ_x^s, τ_eff γ_y^s) on (g_x,i, g_y,i). With
        γ^s = η^c the move is the site's own local move z_i^end − z, as for an iterate."""
        rates = self._rates(request.round)
        tau = reply.metrics["a_norm"] if isinstance(self.tau_eff, str) else self.tau_eff
        return tau * rates["server_lr"], tau * rates["server_dual_lr"]

    def _rates(self, round_: int) -> dict[str, float]:
        """(η_x^c, η_y^c, γ_x^s, γ_y^s) of a round, all divided by the same stage decay."""
        decay = self.lr_decay ** self.stage_of(round_)
        dual = self.dual_lr if self.dual_lr is not None else self.lr
        server = self.server_lr if self.server_lr is not None else self.lr
        server_dual = self.server_dual_lr if self.server_dual_lr is not None else dual
        return {
            "lr": self.lr / decay,
            "dual_lr": dual / decay,
            "server_lr": server / decay,
            "server_dual_lr": server_dual / decay,
        }

    # -- server -------------------------------------------------------------------------
    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        return {
            "round": 0,
            "num_sites": len(site_sizes),  # n
            "total_examples": sum(site_sizes.values()),  # N, for p_i = n_i / N
            "site_sizes": dict(site_sizes),  # n_j of all n sites, for τ_eff (eq. 2)
            "site_steps": {},  # τ_j of the round being run (default: local_steps)
            "dual_min": trainable.dual_min,
            "primal": list(trainable.primal),
            "dual": list(trainable.dual),
            "tau_eff": None,  # the last round's τ_eff, for the logs
            "model": trainable.tensors(),
        }

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        rates = self._rates(round_)
        config = {
            "lr": rates["lr"],
            "dual_lr": rates["dual_lr"],
            "local_steps": self.local_steps,
        }
        return Broadcast(round_, phase, dict(state["model"]), config)

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        n, chosen = state["num_sites"], len(replies)
        if self.site_weighting == "uniform":
            p = [1.0 / n] * chosen
        else:
            p = [r.num_examples / state["total_examples"] for r in replies]
        scaled = [p_i * n / chosen for p_i in p]  # eq. (3): w̃_i = w_i n / |C|, w_i = p_i
        g = weighted_mean([unprefixed(GRADIENT, r.tensors) for r in replies], scaled)  # line 17
        buffers = [{k: t for k, t in r.tensors.items() if k.startswith(BUFFER)} for r in replies]
        mean_buffers = {}
        if any(buffers):  # not in the paper: Σ p_i buf_i / Σ p_i over the participants
            mean_buffers = weighted_mean(buffers, [p_i / sum(p) for p_i in p])
        return self._step(state, g, mean_buffers)

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """Line 17 from sums: Σ_{i∈C} w̃_i g_i = (n/|C|) Σ_{i∈C} p_i · (the p-weighted mean of
        the g_i over the sites that sent each tensor), as ``weighted_mean`` takes it; the
        nodes scale by w_i ∝ p_i, so Σ_{i∈C} p_i = Σ_i w_i / (n or N)."""
        n, chosen = state["num_sites"], len(total.sites)
        norm = n if self.site_weighting == "uniform" else state["total_examples"]
        factor = n / chosen * total.total_weight() / norm
        g = {name: mean * factor for name, mean in total.mean(GRADIENT).items()}
        return self._step(state, g, total.mean())

    def _step(self, state: ServerState, g: Tensors, buffers: Tensors) -> ServerState:
        """Line 18 with the aggregate g; the participants' mean BatchNorm statistics."""
        tau_eff = self.effective_steps(state)
        rates = self._rates(state["round"])
        previous = state["model"]
        model = dict(previous)  # a tensor nobody trained (partial training) keeps its value
        for name in [n for n in state["primal"] if n in g]:  # line 18: descent on x = (w, a, b)
            model[name] = previous[name] - tau_eff * rates["server_lr"] * g[name]
        for name in [n for n in state["dual"] if n in g]:  # line 18: ascent on y = α, then Π
            alpha = previous[name] + tau_eff * rates["server_dual_lr"] * g[name]
            if state["dual_min"] is not None:
                alpha = alpha.clamp(min=state["dual_min"])
            model[name] = alpha
        model.update(buffers)
        return {**state, "round": state["round"] + 1, "model": model, "tau_eff": tau_eff}

    def with_local_steps(self, state: ServerState, steps: Mapping[str, int]) -> ServerState:
        return {**state, "site_steps": {site: int(tau) for site, tau in steps.items()}}

    def effective_steps(self, state: ServerState) -> float:
        """τ_eff = Σ_{j=1}^n p_j ‖ā_j‖₁ over every site, sampled or not (eq. 2)."""
        if not isinstance(self.tau_eff, str):
            return float(self.tau_eff)
        sizes, steps, total = state["site_sizes"], state["site_steps"], state["total_examples"]
        tau_eff = 0.0
        for site, n_j in sizes.items():
            p_j = 1.0 / len(sizes) if self.site_weighting == "uniform" else n_j / total
            tau_eff += p_j * momentum_a_norm(steps.get(site, self.local_steps), self.momentum)
        return tau_eff

    # -- client -------------------------------------------------------------------------
    def _snapshot(self, broadcast: Broadcast) -> dict[str, torch.Tensor] | None:
        """The point of the α-gradients (line 10/11): None = the current local iterate."""
        return None

    def client_update(
        self,
        broadcast: Broadcast,
        local_state: LocalState,
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState]:
        trainable.load(model_part(broadcast.tensors))
        lr, dual_lr = broadcast.config["lr"], broadcast.config["dual_lr"]
        steps = broadcast.config["local_steps"]
        if steps < 1:  # ‖ā_i‖₁ = 0 has no normalized gradient: fail, so the round skips it
            raise ValueError(f"fed_norm_sgda needs at least one local step, got {steps}")
        start = trainable.tensors()  # line 7
        rule = StepRule(lr, self.weight_decay, self.grad_clip)
        loss = self._local_steps(
            trainable, batches, steps, rule, dual_lr, self._snapshot(broadcast)
        )
        a_norm = momentum_a_norm(steps, self.momentum)
        gradients = {}  # lines 13–15 as pseudo-gradients; descent for x, ascent for y
        for name, end in trainable.primal.items():
            moved = start[name] - end.detach()
            gradients[name] = moved / (lr * a_norm)
        for name, end in trainable.dual.items():
            moved = end.detach() - start[name]
            gradients[name] = moved / (dual_lr * a_norm)
        tensors = prefixed(GRADIENT, gradients)
        tensors.update({name: b.detach().clone() for name, b in trainable.buffers.items()})
        metrics = {"a_norm": a_norm, "train_loss": loss}
        return Reply(tensors, steps=steps, metrics=metrics), local_state

    def _local_steps(
        self,
        trainable: Trainable,
        batches: Batches,
        steps: int,
        rule: StepRule,
        dual_lr: float,
        snapshot: dict[str, torch.Tensor] | None,
    ) -> float:
        """Lines 8–11: τ_i heavy-ball SGDA steps (ρ = 0: plain SGD) from a zero buffer.

        The primal direction is clipped and weight-decayed like every backend's StepRule; α is
        left unprojected so the pseudo-gradient stays the a-weighted sum of its gradients.
        """
        primal = list(trainable.primal.values())
        dual = list(trainable.dual.values())
        velocity_x = velocity_y = None
        trainable.model.train()
        total = 0.0
        for done in range(steps):
            batch = next(batches, None)
            if batch is None:
                raise RuntimeError(f"the batch stream ended after {done} of {steps} local steps")
            value, primal_grads, dual_grads = trainable.gradients(*batch)
            if snapshot is not None:  # line 10: ∇_y f_i(x̂^(s), y_i^(t,k); ξ)
                dual_grads = trainable.dual_gradients_at(snapshot, *batch)
            with torch.no_grad():
                direction = primal_direction(trainable, primal_grads, rule, None)
                if velocity_x is None:  # d^(t,0) = 0, so d^(t,1) = ∇f
                    velocity_x, velocity_y = direction, dual_grads
                else:  # d ← ρ d + ∇f
                    torch._foreach_mul_(velocity_x, self.momentum)
                    torch._foreach_add_(velocity_x, direction)
                    if dual:
                        torch._foreach_mul_(velocity_y, self.momentum)
                        torch._foreach_add_(velocity_y, dual_grads)
                torch._foreach_add_(primal, velocity_x, alpha=-rule.lr)  # line 9
                if dual:
                    torch._foreach_add_(dual, velocity_y, alpha=dual_lr)  # lines 10/11
            total += float(value)
        return total / steps


class FedNormSGDAPlus(FedNormSGDA):
    """Fed-Norm-SGDA+: α-gradients at a snapshot x̂ refreshed every S rounds (lines 3–5, 10)."""

    name = "fed_norm_sgda_plus"

    def __init__(self, snapshot_every: int = 10, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(snapshot_every, bool) or int(snapshot_every) != snapshot_every:
            raise ValueError(f"snapshot_every must be an integer ≥ 1, got {snapshot_every!r}")
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be an integer ≥ 1, got {snapshot_every!r}")
        self.snapshot_every = int(snapshot_every)

    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        state = super().init_server(trainable, site_sizes)
        return {**state, "snapshot": {n: state["model"][n] for n in state["primal"]}}  # x̂^(0)

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        broadcast = super().plan(state, round_, phase)
        broadcast.tensors.update(prefixed(SNAPSHOT, state["snapshot"]))  # every round
        return broadcast

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        state = super().aggregate(state, replies, phase)
        if state["round"] % self.snapshot_every == 0:  # line 3 for t = round: x̂ ← x^(t)
            state = {**state, "snapshot": {n: state["model"][n] for n in state["primal"]}}
        return state

    def _snapshot(self, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        return unprefixed(SNAPSHOT, broadcast.tensors)

    def private_draws(self, phase: str, local_steps: int) -> list[Draw]:
        """Each minibatch's α-gradient is evaluated again at the snapshot (line 10)."""
        return [Draw("batch", evaluations=2)] * local_steps

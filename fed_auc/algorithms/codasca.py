"""CODASCA (Yuan, Guo et al., ICML 2021, Algorithms 3–4): CODA+ with control variates.

Algorithm 4, DSGSCA+(v_0, α_0, η_l, η_g, I, R, γ), one stage; F_k^s = F_k + (γ/2)‖v − v_0‖²:

    each machine k: c_v^k = 0, c_α^k = 0 at the stage start; globally c_v = 0, c_α = 0
    for r = 1..R:
        for t = 0..I−1, each machine k:
            v^k_{r,t+1} = v^k_{r,t} − η_l (∇_v F_k^s(v^k_{r,t}, α^k_{r,t}; z) − c_v^k + c_v)
            α^k_{r,t+1} = α^k_{r,t} + η_l (∇_α F_k^s(v^k_{r,t}, α^k_{r,t}; z) − c_α^k + c_α)
        c_v^k = c_v^k − c_v + (v_{r−1} − v^k_{r,I}) / (I η_l)                       (eq. 6)
        c_α^k = c_α^k − c_α + (α^k_{r,I} − α_{r−1}) / (I η_l)
        c_v, c_α = (1/K) Σ_k c_v^k, c_α^k
        v_r = v_{r−1} + η_g ((1/K) Σ_k v^k_{r,I} − v_{r−1}); α_r likewise   (extrapolation)
    return v_r̃, α_r̃ with r̃ uniform in {1..R}

Eq. (6) makes c^k the mean of the round's stochastic gradients of F_k^s (eq. 7).
A site sends only v^k_{r,I}, α^k_{r,I}: its change Δc^k = (v_{r−1} − v^k_{r,I})/(I η_l) − c_v
(and likewise for α) follows from the reply and the broadcast, so the server derives it
(``complete_reply``) and CODASCA uploads as much as CODA+, not the paper's twice as much.
Partial participation: with each sampled site's Δc^k = c^k(new) − c^k(old) the server keeps
c ← c + (1/N) Σ_k Δc^k (SAGA-style), so absent sites keep their last contribution.

The corrections cancel only while c = (1/N) Σ_k c^k, so every change to a reply keeps it:
- DP clipping/noise (on the node): the node derives its c^k from the iterate it actually
  sends (``reply_sent``), exactly as the server derives Δc^k from it. Then c^k = mean
  gradient + (sent − computed)/(I η_l): this round's clipping error, not an accumulated one.
- Robust aggregation is refused (``refuses_robust_aggregation``): a reply clipped on the
  server (``centered_clip``) gives a Δc^k that differs from the c^k its node keeps, and a
  coordinate-wise median of the Δc^k breaks the invariant too (toy: 0.20 and 0.08 from the
  saddle point). Bound hostile replies with ``max_update_norm`` instead (they are rejected).
- Partial training: a tensor's c is the mean over the sites that train it, all of them, as
  they declared at registration (``register_sites``), heard from yet or not.
- ``site_weighting="examples"`` (the objective Σ_k n_k f_k / n): c = Σ_k n_k c^k / n,
  i.e. c ← c + Σ_k n_k Δc^k / n over the sampled sites, n summing every site's n_k (per
  tensor: the sites that train it); the iterates are averaged by examples.
``stage_output="random_round"`` is the paper's r̃ (kept by reservoir sampling on the server).
The default ``"last"`` continues from the last iterate, as the reference code does: restarting
a stage from a random earlier round throws progress away (on the demo federation, pooled AUC
fell from 0.83 to 0.60 at the first stage boundary with "random_round").
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fed_auc.algorithms.base import (
    Backend,
    Batches,
    LocalState,
    SecureTotal,
    ServerState,
    model_part,
    prefixed,
    site_weights,
    unprefixed,
    validate_choice,
    validate_positive,
    weighted_mean,
)
from fed_auc.algorithms.sgda import StepRule, run_local_steps
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.models import group_of
from fed_auc.trainable import AUC, WEIGHT, Tensors, Trainable

REF = "ref/"  # the stage's proximal reference v_0
CONTROL = "c/"  # the global control variates (c_v, c_α)
CONTROL_DELTA = "dc/"  # a site's Δc^k for the SAGA-style server update
ALPHA = AUC + "alpha"  # the dual variable α (Trainable.dual)


class CODASCA(Backend):
    name = "codasca"
    control_delta_prefix = CONTROL_DELTA
    refuses_robust_aggregation = (
        "its control variates need c = mean_k c^k, and the server derives each Δc^k from the "
        "reply it aggregates: a reply clipped on the server gives a Δc^k that differs from "
        "the c^k its node keeps, so the corrections stop cancelling (toy: 0.20 from the "
        "saddle point with centered_clip:1); bound hostile replies with max_update_norm "
        "(they are rejected), or use coda_plus or local_sgda with centered_clip"
    )

    def __init__(
        self,
        gamma: float = 1 / 500,
        eta_g: float = 1.0,
        stage_output: str = "last",
        seed: int = 0,
        **common,
    ) -> None:
        super().__init__(**common)
        validate_positive("gamma", gamma, allow_zero=True)
        validate_positive("eta_g", eta_g)
        validate_choice("stage_output", stage_output, ("random_round", "last"))
        self.gamma = gamma
        self.eta_g = eta_g
        self.stage_output = stage_output
        self.seed = seed

    def reply_layout(self, phase: str = "train") -> ReplyLayout:
        return ReplyLayout(prefixes=("",))  # Δc^k is derived on the server: complete_reply

    def complete_reply(self, reply: Reply, broadcast: Broadcast) -> Reply:
        """Add Δc^k (eq. 6) for every variable the site trained and sent."""
        control = unprefixed(CONTROL, broadcast.tensors)
        end = {n: t for n, t in reply.tensors.items() if n in control}
        delta = control_delta(
            start=model_part(broadcast.tensors),
            end=end,
            control=control,
            steps=reply.steps,
            lr=broadcast.config["lr"],
            dual_lr=broadcast.config.get("dual_lr"),
        )
        return dataclasses.replace(
            reply, tensors={**reply.tensors, **prefixed(CONTROL_DELTA, delta)}
        )

    def reply_sent(
        self, computed: Reply, sent: Reply, broadcast: Broadcast, local_state: LocalState
    ) -> LocalState:
        """c^k from the iterate that left the node (DP): the server derives Δc^k from it."""
        if "control" not in local_state or computed.steps < 1:
            return local_state
        control = unprefixed(CONTROL, broadcast.tensors)
        names = [n for n in local_state["control"] if n in sent.tensors and n in computed.tensors]
        start = model_part(broadcast.tensors)
        lr, dual_lr = broadcast.config["lr"], broadcast.config.get("dual_lr")
        kept = control_delta(
            start, {n: computed.tensors[n] for n in names}, control, sent.steps, lr, dual_lr
        )
        sent_delta = control_delta(
            start, {n: sent.tensors[n] for n in names}, control, sent.steps, lr, dual_lr
        )
        own = dict(local_state["control"])
        for name in names:  # c^k(old) + Δc^k(sent) = c^k(computed) − Δc^k(computed) + Δc^k(sent)
            own[name] = own[name] + (sent_delta[name] - kept[name])
        return {**local_state, "control": own}

    # -- server -------------------------------------------------------------------------
    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        model = trainable.tensors()
        variables = [*trainable.primal, *trainable.dual]
        by_examples = self.site_weighting == "examples"
        return {
            "round": 0,
            "stage": 0,
            "num_sites": len(site_sizes),
            # π_k of c = Σ_k π_k c^k / Σ_k π_k: 1 (the paper's 1/K) or the site's examples
            "site_weight": {s: float(n) if by_examples else 1.0 for s, n in site_sizes.items()},
            "site_groups": {s: None for s in site_sizes},  # None: trains the whole model
            "dual_min": trainable.dual_min,
            "model": model,
            "ref": {n: model[n].clone() for n in trainable.primal},
            "control": {n: torch.zeros_like(model[n]) for n in variables},
            "candidate": None,  # the stage's r̃-th iterate, by reservoir sampling
            "stage_rounds": 0,
        }

    def register_sites(
        self, state: ServerState, registrations: Mapping[str, Mapping[str, Any]]
    ) -> ServerState:
        """Every site's trained layer groups (partial training), for the per-tensor means."""
        groups = {s: r.get("trained_groups") for s, r in registrations.items()}
        return {**state, "site_groups": {**state.get("site_groups", {}), **groups}}

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        tensors = {
            **state["model"],
            **prefixed(REF, state["ref"]),
            **prefixed(CONTROL, state["control"]),
        }
        config = {
            "lr": self.lr_of(round_),
            "dual_lr": self.dual_lr_of(round_),
            "local_steps": self.local_steps,
            "stage": state["stage"],
        }
        return Broadcast(round_, phase, tensors, config)

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        weights = site_weights(replies, self.site_weighting)
        averaged = weighted_mean([model_part(r.tensors) for r in replies], weights)
        return self._advance(state, averaged, self._control(state, replies))

    def secure_layout(self, phase: str = "train") -> ReplyLayout:
        """The iterates and Δc^k: under secure aggregation the node computes Δc^k (it
        cannot be derived from a sum of iterates) and masks it with them."""
        return ReplyLayout(prefixes=("", CONTROL_DELTA))

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """The mean iterate and c ← c + Σ_k π_k Δc^k / Σ_j π_j from the sums alone."""
        sums = {}
        for name, c in state["control"].items():
            key = CONTROL_DELTA + name
            if key in total.sums and total.total_weight(key) > 0:
                sums[name] = total.total(key).to(c.dtype)
        weight = dict(state.get("site_weight") or {})
        groups = dict(state.get("site_groups") or {})
        return self._advance(state, total.mean(), self._apply_control(state, sums, weight, groups))

    def _advance(self, state: ServerState, averaged: Tensors, control: Tensors) -> ServerState:
        """The round's new state from the mean iterate and the new control variates."""
        previous = state["model"]
        model = {**previous, **averaged}  # buffers: plain average; η_g = 1: v_r = the average
        if self.eta_g != 1:  # v_r = v_{r−1} + η_g (mean_k v^k_{r,I} − v_{r−1})
            for name in [n for n in state["control"] if n in averaged]:
                model[name] = previous[name] + self.eta_g * (averaged[name] - previous[name])
        if state["dual_min"] is not None and ALPHA in model:
            model[ALPHA] = model[ALPHA].clamp(min=state["dual_min"])
        state = {**state, "round": state["round"] + 1, "model": model, "control": control}
        state["stage_rounds"] += 1
        if self.stage_output == "random_round" and self._keep(state):
            # the whole model of that round: its weights with its BatchNorm statistics
            state["candidate"] = {n: t.clone() for n, t in model.items()}
        if self.stage_of(state["round"]) != state["stage"]:
            state = self._next_stage(state)
        return state

    def _control(self, state: ServerState, replies: Sequence[Reply]) -> Tensors:
        """c ← c + Σ_k π_k Δc^k / Σ_j π_j per tensor: k over the replies that carry it, j over
        every site that trains it (registered; an unregistered replier counts as one more)."""
        examples = self.site_weighting == "examples"
        weight = dict(state.get("site_weight") or {})
        groups = dict(state.get("site_groups") or {})
        for r in replies:
            if r.site not in weight:
                weight[r.site] = float(r.num_examples) if examples else 1.0
                groups[r.site] = r.trained_groups
        sums = {}
        for name in state["control"]:
            key = CONTROL_DELTA + name
            held = [(weight[r.site], r.tensors[key]) for r in replies if key in r.tensors]
            if held:
                sums[name] = sum(w * delta for w, delta in held)
        return self._apply_control(state, sums, weight, groups)

    @staticmethod
    def _apply_control(
        state: ServerState,
        sums: Tensors,
        weight: Mapping[str, float],
        groups: Mapping[str, Sequence[str] | None],
    ) -> Tensors:
        """c + Σ_k π_k Δc^k / Σ_j π_j for the tensors in ``sums``; the others keep c."""
        control = {}
        for name, c in state["control"].items():
            if name not in sums:
                control[name] = c
                continue
            total = sum(w for site, w in weight.items() if _trains(name, groups.get(site)))
            control[name] = c + sums[name] / total
        return control

    def _keep(self, state: ServerState) -> bool:
        """Reservoir sampling: after R rounds each round's iterate is kept with prob. 1/R."""
        rng = random.Random(f"{self.seed}:{state['stage']}:{state['stage_rounds']}")
        return rng.random() < 1.0 / state["stage_rounds"]

    def _next_stage(self, state: ServerState) -> ServerState:
        """Algorithm 3: (v_s, α_s) = stage output; it starts and anchors the next stage."""
        model = dict(state["model"])
        if self.stage_output == "random_round":
            model.update(state["candidate"])
        variables = state["control"]
        return {
            **state,
            "model": model,
            "ref": {n: model[n].clone() for n in state["ref"]},
            "control": {n: torch.zeros_like(c) for n, c in variables.items()},
            "stage": state["stage"] + 1,
            "candidate": None,
            "stage_rounds": 0,
        }

    # -- client -------------------------------------------------------------------------
    def client_update(
        self,
        broadcast: Broadcast,
        local_state: LocalState,
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState]:
        trainable.load(model_part(broadcast.tensors))
        names = [*trainable.primal, *trainable.dual]
        n_primal = len(trainable.primal)
        stage = broadcast.config["stage"]
        control = unprefixed(CONTROL, broadcast.tensors)
        own = local_state.get("control") if local_state.get("stage") == stage else None
        if own is None:  # Algorithm 4: c^k = 0 at the start of every stage
            own = {n: torch.zeros_like(control[n]) for n in names}
        start = {n: t.detach().clone() for n, t in {**trainable.primal, **trainable.dual}.items()}

        # local steps on the corrected gradient  ∇F_k^s − c^k + c
        correction = [control[n] - own[n] for n in names]
        ref = unprefixed(REF, broadcast.tensors)
        lr, steps = broadcast.config["lr"], broadcast.config["local_steps"]
        dual_lr = broadcast.config.get("dual_lr")
        rule = StepRule(lr, self.weight_decay, self.grad_clip, self.gamma, dual_lr)
        loss, done = run_local_steps(
            trainable,
            batches,
            steps,
            rule,
            prox_ref=[ref[n] for n in trainable.primal],
            correction=(correction[:n_primal], correction[n_primal:]),
        )

        # eq. (6): c^k ← c^k + Δc^k; the server derives the same Δc^k from the reply
        end = {n: t.detach() for n, t in (trainable.primal | trainable.dual).items()}
        delta = control_delta(start, end, control, done, lr, dual_lr)
        new_own = {n: own[n] + delta[n] for n in names}
        reply = Reply(trainable.tensors(), steps=done, metrics={"train_loss": loss})
        return reply, {"stage": stage, "control": new_own}


def control_delta(
    start: Tensors,
    end: Tensors,
    control: Tensors,
    steps: int,
    lr: float,
    dual_lr: float | None = None,
) -> Tensors:
    """Δc^k = c^k(new) − c^k(old) of eq. (6), for the variables in ``end``:
    (v_{r−1} − v^k_{r,I}) / (I η_l) − c_v for the primal (it moved down its gradient),
    (α^k_{r,I} − α_{r−1}) / (I η_α) − c_α for the dual (it moved up), each variable divided
    by its own step size (η_α = ``dual_lr``, η_l if None) so c estimates a gradient."""
    delta = {}
    for name, value in end.items():
        dual = name == ALPHA
        moved = value - start[name] if dual else start[name] - value
        rate = dual_lr if dual and dual_lr is not None else lr
        delta[name] = moved / (steps * rate) - control[name]
    return delta


def _trains(name: str, groups: Sequence[str] | None) -> bool:
    """Whether a site that trains ``groups`` (None: the whole model) trains tensor ``name``;
    a, b and α are trained by every site."""
    if groups is None or not name.startswith(WEIGHT):
        return True
    return group_of(name[len(WEIGHT) :]) in groups

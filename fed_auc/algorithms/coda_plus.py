"""CODA+ (Yuan, Guo et al., ICML 2021, Algorithms 1–2).

Algorithm 1 runs stages s = 1..S; each stage is DSG+ (Algorithm 2) on the proximal subproblem
(eq. 5)  min_v max_α f(v, α) + (γ/2)‖v − v_0^s‖²,  v = (w, a, b):

    for t = 0..T−1, each machine k:
        v^k_{t+1} = v^k_t − η (∇_v F_k(v^k_t, α^k_t; z^k_t) + γ (v^k_t − v_0))
        α^k_{t+1} = α^k_t + η  ∇_α F_k(v^k_t, α^k_t; z^k_t)
        if (t+1) mod I == 0:  v^k, α^k ← (1/K) Σ_k v^k, α^k          (one round)
    return v̄ = (1/K) Σ_k (1/T) Σ_t v^k_t,  ᾱ likewise                   (stage output)

Stages follow the reference code: η ÷ 3 every T0 steps (``decay_every``), γ = 1/500.
``stage_output="average"`` is the paper's v̄ (each site reports its round's mean iterate; a
variable no replier trained in a round, e.g. the input side in a round only weak sites
answered, counts with the value it kept all round). The BatchNorm statistics of the output
are the stage's average of the rounds' aggregated statistics, as for the weights.
The default ``"last"`` continues from the last averaged iterate and makes it the new
reference, as practical code does: with the fixed, short stages used in practice the average
still carries the stage's early iterates (on the demo federation, pooled AUC fell from 0.77
to 0.66 at the first stage boundary with "average"; with "last" it kept rising).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
from fed_auc.trainable import BUFFER, Tensors, Trainable

REF = "ref/"  # the stage's proximal reference v_0^s
MEAN = "mean/"  # a site's mean iterate over its local steps this round


class CODAPlus(Backend):
    name = "coda_plus"

    def __init__(self, gamma: float = 1 / 500, stage_output: str = "last", **common) -> None:
        super().__init__(**common)
        validate_positive("gamma", gamma, allow_zero=True)
        validate_choice("stage_output", stage_output, ("average", "last"))
        self.gamma = gamma
        self.stage_output = stage_output

    def reply_layout(self, phase: str = "train") -> ReplyLayout:
        return ReplyLayout(prefixes=("", MEAN) if self.stage_output == "average" else ("",))

    # -- server -------------------------------------------------------------------------
    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        model = trainable.tensors()
        return {
            "round": 0,
            "stage": 0,
            "model": model,
            "ref": {n: model[n].clone() for n in trainable.primal},  # v_0 of stage 1
            "stage_sum": {},  # Σ over the stage's rounds of the sites' mean iterates
            "stage_rounds": 0,
        }

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        config = {
            "lr": self.lr_of(round_),
            "dual_lr": self.dual_lr_of(round_),
            "local_steps": self.local_steps,
            "stage": state["stage"],
        }
        return Broadcast(round_, phase, {**state["model"], **prefixed(REF, state["ref"])}, config)

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        weights = site_weights(replies, self.site_weighting)
        # communication round: v, α ← (1/K) Σ_k v^k, α^k   (Algorithm 2)
        averaged = weighted_mean([model_part(r.tensors) for r in replies], weights)
        round_mean = None
        if self.stage_output == "average":
            round_mean = weighted_mean([unprefixed(MEAN, r.tensors) for r in replies], weights)
        return self._advance(state, averaged, round_mean)

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """The same means (iterates, and the mean iterates for ``"average"``) from sums."""
        round_mean = total.mean(MEAN) if self.stage_output == "average" else None
        return self._advance(state, total.mean(), round_mean)

    def _advance(
        self, state: ServerState, averaged: Tensors, round_mean: Tensors | None
    ) -> ServerState:
        """The round's new model from the sites' mean iterate (and mean of iterates)."""
        previous = state["model"]
        model = {**previous, **averaged}  # a tensor nobody trained keeps its value
        state = {**state, "round": state["round"] + 1, "model": model}
        if round_mean is not None:
            for name, value in previous.items():  # nobody trained it: constant all round
                if not name.startswith(BUFFER):
                    round_mean.setdefault(name, value)
            # BatchNorm statistics averaged over the stage like the weights they go with
            round_mean.update({n: t for n, t in model.items() if n.startswith(BUFFER)})
            state["stage_sum"] = _add(state["stage_sum"], round_mean)
            state["stage_rounds"] += 1
        if self.stage_of(state["round"]) != state["stage"]:
            state = self._next_stage(state)
        return state

    def _next_stage(self, state: ServerState) -> ServerState:
        """Algorithm 1: (v_s, α_s) = stage output; v_s is the next stage's start and reference."""
        model = dict(state["model"])
        if self.stage_output == "average":
            model.update({n: t / state["stage_rounds"] for n, t in state["stage_sum"].items()})
        ref = {n: model[n].clone() for n in state["ref"]}
        return {
            **state,
            "model": model,
            "ref": ref,
            "stage": state["stage"] + 1,
            "stage_sum": {},
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
        ref = unprefixed(REF, broadcast.tensors)
        prox_ref = [ref[n] for n in trainable.primal]
        config = broadcast.config
        rule = StepRule(
            config["lr"], self.weight_decay, self.grad_clip, self.gamma, config.get("dual_lr")
        )
        steps = broadcast.config["local_steps"]
        iterate_sum = None
        if self.stage_output == "average":
            iterate_sum = [torch.zeros_like(t) for t in _variables(trainable)]
        loss, done = run_local_steps(trainable, batches, steps, rule, prox_ref, None, iterate_sum)
        tensors = trainable.tensors()
        if iterate_sum is not None:
            names = [*trainable.primal, *trainable.dual]
            tensors.update({MEAN + n: s / done for n, s in zip(names, iterate_sum, strict=True)})
        return Reply(tensors, steps=done, metrics={"train_loss": loss}), local_state


def _variables(trainable: Trainable) -> list[torch.Tensor]:
    return [*trainable.primal.values(), *trainable.dual.values()]


def _add(acc: Tensors, new: Tensors) -> Tensors:
    if not acc:
        return {n: t.clone() for n, t in new.items()}
    return {n: acc[n] + new[n] for n in acc}

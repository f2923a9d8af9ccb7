"""Local SGDA: the min-max baseline.

Every selected site runs I local SGDA steps on (w, a, b) / α from the broadcast iterate;
the server averages the iterates (primal, dual and BatchNorm buffers). No proximal term,
no control variates: with heterogeneous sites the average drifts from the global saddle point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fed_auc.algorithms.base import (
    Backend,
    Batches,
    LocalState,
    SecureTotal,
    ServerState,
    model_part,
    site_weights,
    weighted_mean,
)
from fed_auc.algorithms.sgda import StepRule, run_local_steps
from fed_auc.exchange import Broadcast, Reply
from fed_auc.trainable import Trainable


class LocalSGDA(Backend):
    name = "local_sgda"

    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        return {"round": 0, "model": trainable.tensors()}

    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast:
        config = {
            "lr": self.lr_of(round_),
            "dual_lr": self.dual_lr_of(round_),
            "local_steps": self.local_steps,
        }
        return Broadcast(round_, phase, dict(state["model"]), config)

    def client_update(
        self,
        broadcast: Broadcast,
        local_state: LocalState,
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState]:
        trainable.load(model_part(broadcast.tensors))
        config = broadcast.config
        rule = StepRule(
            config["lr"], self.weight_decay, self.grad_clip, dual_lr=config.get("dual_lr")
        )
        loss, steps = run_local_steps(trainable, batches, broadcast.config["local_steps"], rule)
        return Reply(trainable.tensors(), steps=steps, metrics={"train_loss": loss}), local_state

    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState:
        weights = site_weights(replies, self.site_weighting)
        model = {
            **state["model"],
            **weighted_mean([model_part(r.tensors) for r in replies], weights),
        }
        return {**state, "round": state["round"] + 1, "model": model}

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """The same weighted mean, per tensor over its senders, from the sums alone."""
        model = {**state["model"], **total.mean()}
        return {**state, "round": state["round"] + 1, "model": model}

"""Personalized models per site (LSGD-PFL, Hanzely et al.), on top of any backend.

``head``: the backbone is shared, each site keeps its own head (the classifier, and the AUC
loss's a, b, α, which track the site's own score distribution and prevalence). The backend
trains backbone and head together for its local steps (LSGD-PFL), with the head's learning
rate ``lr_ratio`` times the shared one: the paper's M^{-1/2} rescaling of the shared block is
exactly ``lr_personal = M · lr_shared``. Only the backbone leaves the site.

``l2``: each site keeps a full personal model β_m coupled to the global w by (λ/2)‖β_m − w‖²
(Ditto-style): the backend trains the global model unchanged, then the site takes as many
local steps on β_m, each followed by the proximal map of the coupling,
β ← (β − η ∇f_m(β) + η λ w) / (1 + η λ), which is stable for any λ: λ → ∞ gives β = w.

Personal tensors stay in the node's local state file and never appear in a reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fed_auc.algorithms.base import Backend, Batches, Draw, LocalState, model_part
from fed_auc.algorithms.codasca import CONTROL, REF
from fed_auc.algorithms.sgda import StepRule, primal_direction
from fed_auc.exchange import Broadcast, Reply
from fed_auc.models import group_of
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors, Trainable

MODES = ("head", "l2")


@dataclass(frozen=True)
class Personalization:
    mode: str = "head"
    lam: float = 1.0  # l2: coupling λ
    lr_ratio: float = 1.0  # head: personal / shared learning rate (the paper: M sites)
    head_groups: tuple[str, ...] = ("classifier",)  # head: personal layer groups
    auc_personal: bool = True  # head: a, b, α personal too

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"personalize must be one of {list(MODES)}, got {self.mode!r}")
        for name, value in (("personal_lambda", self.lam), ("personal_lr_ratio", self.lr_ratio)):
            if not (isinstance(value, int | float) and 0 <= value < float("inf")):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")

    def check_backend(self, backend: Backend) -> None:
        """FedSGDA's global gradient estimate spans every tensor: no private head there."""
        if self.mode == "head" and backend.refuses_personal_head:
            raise ValueError(
                f"--personalize head does not compose with {backend.name} "
                f"({backend.refuses_personal_head}); use --personalize l2"
            )

    def private_draws(self, local_steps: int) -> list[Draw]:
        """What the personal model draws besides the backend (DP-SGD's plan): ``l2`` takes
        its own ``local_steps`` minibatches after the backend's; ``head`` trains inside it."""
        return [Draw("batch")] * local_steps if self.mode == "l2" else []

    def personal_names(self, names: Iterable[str]) -> list[str]:
        """The model tensors that stay on the site and never travel (none for ``l2``)."""
        if self.mode != "head":
            return []
        groups = set(self.head_groups)

        def personal(name: str) -> bool:
            if name.startswith(AUC):
                return self.auc_personal
            return bool(groups) and group_of(name.split("/", 1)[1]) in groups

        return [n for n in names if n.startswith((WEIGHT, BUFFER, AUC)) and personal(n)]

    def setup(self, trainable: Trainable) -> None:
        """The head's per-block learning rate, as a gradient factor every backend uses."""
        if self.mode == "head" and self.lr_ratio != 1:
            names = self.personal_names(trainable.names())
            trainable.grad_scale = {n: float(self.lr_ratio) for n in names}

    # -- one local round --------------------------------------------------------------------
    def train(
        self,
        backend: Backend,
        broadcast: Broadcast,
        local_state: LocalState,
        personal: dict[str, Any],
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState, dict[str, Any]]:
        if self.mode == "head":
            return self._train_head(backend, broadcast, local_state, personal, trainable, batches)
        reply, local_state = backend.client_update(broadcast, local_state, trainable, batches)
        if "local_steps" not in broadcast.config:  # a phase without local steps (collect)
            return reply, local_state, personal
        personal = {"tensors": self._train_l2(broadcast, personal, trainable, batches, backend)}
        return reply, local_state, personal

    def _train_head(self, backend, broadcast, local_state, personal, trainable, batches):
        names = self.personal_names(n for n in broadcast.tensors if n in trainable.names())
        own = personal.get("tensors") or {n: broadcast.tensors[n].clone() for n in names}
        stage = broadcast.config.get("stage")
        ref = personal.get("ref") if personal.get("ref_stage") == stage else None
        ref = ref or {n: t.clone() for n, t in own.items()}  # the head's own stage anchor
        view = dict(broadcast.tensors)
        view.update(own)
        same_stage = local_state.get("stage") == stage
        own_control = (local_state.get("control") if same_stage else None) or {}
        for n in names:  # the server's c, ref and snapshot mean nothing for a private head
            if CONTROL + n in view:  # CODASCA: c := c_k, so the head's correction is zero
                view[CONTROL + n] = own_control.get(n, torch.zeros_like(own[n]))
            if REF + n in view:
                view[REF + n] = ref[n]
            if "snap/" + n in view:
                view["snap/" + n] = own[n]
        view_broadcast = Broadcast(broadcast.round, broadcast.phase, view, broadcast.config)
        reply, local_state = backend.client_update(view_broadcast, local_state, trainable, batches)
        current = trainable.everything()
        personal = {"tensors": {n: current[n] for n in names}, "ref": ref, "ref_stage": stage}
        private = set(names)
        reply.tensors = {k: t for k, t in reply.tensors.items() if not _is_personal(k, private)}
        return reply, local_state, personal

    def _train_l2(self, broadcast, personal, trainable, batches, backend) -> Tensors:
        target = model_part(broadcast.tensors)  # w: the global model this round started from
        beta = personal.get("tensors") or {n: t.clone() for n, t in target.items()}
        trainable.load(beta)
        lr = broadcast.config.get("lr", backend.lr)
        rule = StepRule(lr, backend.weight_decay, backend.grad_clip)
        shrink = 1.0 / (1.0 + lr * self.lam)
        primal, dual = list(trainable.primal.values()), list(trainable.dual.values())
        anchor_p = [target[n] for n in trainable.primal]
        anchor_d = [target[n] for n in trainable.dual]
        trainable.model.train()
        for _ in range(int(broadcast.config["local_steps"])):
            _, gp, gd = trainable.gradients(*next(batches))
            with torch.no_grad():
                direction = primal_direction(trainable, gp, rule, None)
                torch._foreach_add_(primal, direction, alpha=-lr)  # β − η ∇f
                torch._foreach_add_(primal, anchor_p, alpha=lr * self.lam)  # + η λ w
                torch._foreach_mul_(primal, shrink)  # / (1 + η λ)
                if dual:
                    torch._foreach_add_(dual, gd, alpha=lr)
                    torch._foreach_add_(dual, anchor_d, alpha=lr * self.lam)
                    torch._foreach_mul_(dual, shrink)
                    trainable.project_()
        return trainable.everything()

    def model(self, global_tensors: Tensors, personal: dict[str, Any]) -> Tensors | None:
        """The site's personal model, or None before its first local round."""
        own = personal.get("tensors")
        if not own:
            return None
        return {**global_tensors, **own} if self.mode == "head" else dict(own)


def _is_personal(key: str, private: set[str]) -> bool:
    """``w/…`` itself, or a prefixed companion such as ``dc/w/…`` or ``g/auc/a``."""
    return key in private or key.split("/", 1)[-1] in private

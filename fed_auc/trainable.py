"""A node's model and loss seen as named tensors: what the backends update and what travels.

Names are namespaced so a payload is one flat ``dict[str, Tensor]``:
``w/<param>`` network parameters, ``auc/a`` and ``auc/b`` the loss's primal variables,
``auc/alpha`` its dual variable, ``buf/<buffer>`` floating-point buffers (BatchNorm running
statistics). Backends add their own prefixes (``c/``, ``ref/``, ``dc/``...) on top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fed_auc.losses import build_loss
from fed_auc.models import group_names, group_of

Tensors = dict[str, torch.Tensor]

WEIGHT = "w/"
AUC = "auc/"
BUFFER = "buf/"


def full_precision(logits: torch.Tensor) -> torch.Tensor:
    """Logits from an autocast region (fp16/bf16) as fp32, for the loss and its a, b, α;
    fp32 and fp64 logits as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def batch_loss(
    loss: nn.Module,
    logits: torch.Tensor,
    y: torch.Tensor,
    row_weights: torch.Tensor | None,
    variables: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The loss of a batch, with the loss's own variables (a, b, α) replaced by ``variables``
    if given. Row weights go to the minimax (AUC) losses, whose p must match the batch's;
    cross-entropy trains on the batch as drawn (fed_auc.losses, "Row weights")."""
    args = (logits, y)
    if row_weights is not None and getattr(loss, "is_minimax", False):
        args = (logits, y, row_weights)
    return loss(*args) if variables is None else functional_call(loss, dict(variables), args)


class Trainable:
    """The model and loss of one node, with the primal block v = (w, a, b) and dual block α.

    The backends only touch this object: its named parameter dicts, ``gradients`` and
    ``project_``. A toy problem with the same members can stand in for it in tests.
    """

    # Defaults for the whole model (subclasses such as the tests' toy problem rely on them).
    trained_groups: list[str] | None = None  # partial training: the trained suffix
    grad_scale: Mapping[str, float] = MappingProxyType({})  # per-tensor gradient factor
    _frozen: Mapping[str, torch.Tensor] = MappingProxyType({})  # the untrained input side
    _prefix: nn.Module | None = None
    _suffix: nn.Module | None = None
    # Example-level DP-SGD while a node trains (fed_auc.privacy.dp_sgd.PrivateGradients): every
    # gradient below is then clipped per example and noised; None = plain autograd.
    private: Any = None
    # fp16 (fed_auc.node.compute.LossScale): plain gradients go through its loss scale.
    loss_scale: Any = None

    @classmethod
    def with_loss(cls, model: nn.Module, loss_name: str) -> Trainable:
        """``model`` with the named loss for its labels (p = 0.5 until the federation's
        prevalence is known): the one way a node, a server or a measurement builds one."""
        labels = int(model.num_labels)
        return cls(model, build_loss(loss_name, labels, [0.5] * labels))

    def __init__(self, model: nn.Module, loss: nn.Module) -> None:
        self.model = model
        self.loss = loss
        self.primal: dict[str, torch.Tensor] = {
            WEIGHT + name: p for name, p in model.named_parameters() if p.requires_grad
        }
        self.dual: dict[str, torch.Tensor] = {}
        if getattr(loss, "is_minimax", False):
            self.primal[AUC + "a"] = loss.a
            self.primal[AUC + "b"] = loss.b
            self.dual[AUC + "alpha"] = loss.alpha
        self.buffers: dict[str, torch.Tensor] = {
            BUFFER + name: b for name, b in model.named_buffers() if b.is_floating_point()
        }
        self._primal_list = list(self.primal.values())
        self._dual_list = list(self.dual.values())

    def train_only(self, groups: Sequence[str]) -> None:
        """Train only ``groups``, an output-side suffix of the model's layer groups
        (EmbracingFL): the input side runs frozen, in eval mode and without autograd, so it
        costs no activation memory and its weights and BatchNorm statistics never change.
        ``primal``, ``buffers`` and ``tensors()`` then hold the trained part only."""
        order = group_names(self.model)
        start = len(order) - len(groups)
        if start < 0 or list(groups) != order[start:]:
            raise ValueError(
                f"trained groups {list(groups)} are not an output-side suffix of {order}"
            )
        trained = set(groups)
        for name, p in self.model.named_parameters():
            p.requires_grad_(group_of(name) in trained)

        def keep(name: str) -> bool:
            return (
                not name.startswith((WEIGHT, BUFFER)) or group_of(name.split("/", 1)[1]) in trained
            )

        everything = {**self.primal, **self.buffers}
        self._frozen = {n: t for n, t in everything.items() if not keep(n)}
        self.primal = {n: t for n, t in self.primal.items() if keep(n)}
        self.buffers = {n: t for n, t in self.buffers.items() if keep(n)}
        self._primal_list = list(self.primal.values())
        self.trained_groups = list(groups)
        features = list(self.model.net.features.named_children())
        cut = next(
            (i for i, (n, _) in enumerate(features) if group_of(f"net.features.{n}.x") in trained),
            len(features),
        )
        self._prefix = nn.Sequential(*[m for _, m in features[:cut]])
        self._suffix = nn.Sequential(*[m for _, m in features[cut:]], self.model.net.class_layers)

    def to(self, device: torch.device) -> Trainable:
        """The model and loss moved to ``device``, in place; the named views (``primal``,
        ``dual``, ``buffers``) follow the moved tensors (buffers, and parameters moved across
        tensor types, are new objects after a move)."""
        self.model.to(device)
        self.loss.to(device)
        current = {BUFFER + n: b for n, b in self.model.named_buffers()}
        current.update({WEIGHT + n: p for n, p in self.model.named_parameters()})
        current.update({AUC + n: p for n, p in self.loss.named_parameters()})
        for view in ("primal", "dual", "buffers", "_frozen"):
            setattr(self, view, {n: current[n] for n in getattr(self, view)})
        self._primal_list = list(self.primal.values())
        self._dual_list = list(self.dual.values())
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits, in full precision whatever the autocast (the AUC loss and its a, b, α
        stay fp32); with a frozen prefix, only the trained suffix records a graph."""
        if self._prefix is None:
            return full_precision(self.model(x))
        with torch.no_grad():
            self._prefix.eval()  # its BatchNorm uses, and keeps, the global statistics
            hidden = self._prefix(self.model.prepare(x))
        return full_precision(self._suffix(hidden))

    @property
    def is_minimax(self) -> bool:
        return bool(self.dual)

    @property
    def dual_min(self) -> float | None:
        """Lower bound of α (0 for the margin loss), or None when α is unconstrained."""
        return getattr(self.loss, "dual_min", None)

    def gradients(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor | None = None,
        *,
        label_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Loss on one batch and its gradients w.r.t. the primal and dual blocks (in order).

        ``row_weights`` (one per row): the sampler's weights (``Batch.weights``), so
        ``trainable.gradients(*batch)`` takes a batch as drawn. ``label_weights`` (one per
        label): the loss is Σ_l weight_l · (the loss of label l alone, the other labels taken
        as unknown) instead of the loss of all labels, so the chunks of a pass can each be
        weighted by their share of every label's known rows.
        """
        if self.private is not None:
            value, grads = self.private.gradients(self, x, y, row_weights, label_weights)
        else:
            value, grads = self._plain_gradients(x, y, row_weights, label_weights)
        if self.grad_scale:  # per-block learning rates: lr · factor for these tensors
            names = [*self.primal, *self.dual]
            for i, name in enumerate(names):
                if name in self.grad_scale:
                    grads[i] = grads[i] * self.grad_scale[name]
        n = len(self._primal_list)
        return value.detach(), grads[:n], grads[n:]

    def _plain_gradients(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor | None,
        label_weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits = self.forward(x)
        if label_weights is None:
            value = batch_loss(self.loss, logits, y, row_weights)
        else:
            column = torch.arange(y.shape[1], device=y.device)
            terms = [
                weight
                * batch_loss(
                    self.loss, logits, torch.where(column == label, y, torch.nan), row_weights
                )
                for label, weight in enumerate(label_weights.tolist())
                if weight
            ]
            value = torch.stack(terms).sum()
        inputs = self._primal_list + self._dual_list
        if self.loss_scale is not None:  # fp16: scaled, then unscaled to fp32
            return value, self.loss_scale.gradients(value, inputs)
        return value, list(torch.autograd.grad(value, inputs))

    def dual_gradients_at(
        self,
        point: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        row_weights: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """∇_α of the loss on one batch with the primal block taken at ``point`` (``w/…``,
        ``auc/…``) and α at its current value: Fed-Norm-SGDA+'s ascent direction at a snapshot.

        The network runs on scratch copies of its buffers, so a train-mode forward at the
        snapshot leaves this node's BatchNorm statistics untouched.
        """
        if self.private is not None:
            return self.private.dual_gradients_at(self, point, x, y, row_weights)
        params = {n[len(WEIGHT) :]: t for n, t in point.items() if n.startswith(WEIGHT)}
        scratch = {n: b.clone() for n, b in self.model.named_buffers()}
        with torch.no_grad():  # α's gradient needs the scores, not their graph
            scores = full_precision(functional_call(self.model, {**params, **scratch}, (x,)))
        loss_params = {
            n[len(AUC) :]: t for n, t in point.items() if n.startswith(AUC) and n in self.primal
        }
        value = batch_loss(self.loss, scores, y, row_weights, loss_params)
        return list(torch.autograd.grad(value, self._dual_list))

    @torch.no_grad()
    def project_(self) -> None:
        """Project the dual variable onto its feasible set (α ≥ 0 for the margin loss)."""
        project = getattr(self.loss, "project_", None)
        if project is not None:
            project()

    def tensors(self) -> Tensors:
        """Detached copies of everything that is averaged: primal, dual and buffers."""
        out = {}
        for group in (self.primal, self.dual, self.buffers):
            out.update({name: t.detach().clone() for name, t in group.items()})
        return out

    @torch.no_grad()
    def load(self, tensors: Tensors) -> None:
        """Copy named tensors in place; names this node does not own are an error."""
        for name, value in tensors.items():
            target = self._tensor(name)
            if target is None:
                raise KeyError(f"tensor {name!r} does not belong to this model or loss")
            if target.shape != value.shape:
                raise ValueError(
                    f"tensor {name!r}: expected shape {tuple(target.shape)}, "
                    f"got {tuple(value.shape)}"
                )
            target.copy_(value)

    def _tensor(self, name: str) -> torch.Tensor | None:
        for group in (self.primal, self.dual, self.buffers, self._frozen):
            if name in group:
                return group[name]
        return None

    def everything(self) -> Tensors:
        """Detached copies of the whole model and loss state, frozen parts included."""
        out = self.tensors()
        out.update({name: t.detach().clone() for name, t in self._frozen.items()})
        return out

    def names(self) -> list[str]:
        return [*self.primal, *self.dual, *self.buffers]

"""AUC min-max losses (square and margin) and a masked BCE baseline, all multi-label.

Every loss takes logits (B, L) and targets (B, L) with 1 = positive, 0 = negative and
NaN = unknown; unknown entries contribute nothing. The score is h = sigmoid(logit).

The AUC losses own their auxiliary variables as parameters of shape (L,): `a` and `b`
(primal, minimized together with the network) and `alpha` (dual, maximized). The optimizer
performs the descent/ascent step; these modules only define the objective. Per label, batch
means divide by the number of rows whose label is known, not by the number of positives, so
a batch without positives is fine (codasca_notes §6.2 item 11). The total is the sum over
labels, so each label's (a, b, alpha) receives exactly its single-label gradient.

Row weights. The AUC losses weight each row by p or 1 − p, so they are right only when a
batch holds positives at the rate p of the data. A sampler with a positive floor
over-samples positives (``fed_auc.data.sampling``); it hands each row a weight that makes
the batch an unbiased sample again, and ``weights`` multiplies row i's whole loss,
α's own terms included: loss = (1/n) Σ_i w_i · ℓ_i, with ℓ_i the loss of the one-row batch
{i}. That keeps the loss a sum of per-row terms (DP-SGD clips each one) and puts the
batch's α-maximizer back at m + mean(h | y=0) − mean(h | y=1) whatever the batch's
positive count. Cross-entropy takes no weights: for it the floor is class rebalancing, a
choice of objective the baseline keeps (``Trainable`` passes weights to minimax losses
only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

PosRatio = float | Sequence[float] | torch.Tensor

LOSSES: tuple[str, ...] = ("auc_margin", "auc_square", "ce")


def _as_2d(
    logits: torch.Tensor, targets: torch.Tensor, num_labels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept (B,) for one label; demand matching (B, num_labels) shapes otherwise."""
    if logits.ndim == 1 and num_labels == 1:
        logits = logits.unsqueeze(1)
    if targets.ndim == 1 and num_labels == 1:
        targets = targets.unsqueeze(1)
    if logits.ndim != 2 or logits.shape[1] != num_labels or targets.shape != logits.shape:
        raise ValueError(
            f"expected logits and targets of shape (B, {num_labels}), "
            f"got logits {tuple(logits.shape)} and targets {tuple(targets.shape)}"
        )
    return logits, targets


def _class_masks(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positive and negative indicators (NaN rows are neither) and known-row counts per label."""
    known = ~torch.isnan(targets)
    if not torch.all((targets[known] == 0) | (targets[known] == 1)):
        bad = targets[known & (targets != 0) & (targets != 1)]
        raise ValueError(
            f"AUC loss targets must be 0, 1 or NaN; got value {bad.flatten()[0].item()!r}"
        )
    pos = (targets == 1).to(targets.dtype)
    neg = (targets == 0).to(targets.dtype)
    return pos, neg, known.sum(dim=0).to(targets.dtype)


def _weighted(
    per_row: torch.Tensor, known: torch.Tensor, n: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per label: (1/n) Σ_i w_i · (row i's data term), and (1/n) Σ_known w_i, the share of
    α's own terms the rows carry (1 with unit weights, 0 for a label with no known row)."""
    if weights is not None:
        if weights.shape != per_row.shape[:1]:
            raise ValueError(
                f"row weights must have shape ({per_row.shape[0]},), got {tuple(weights.shape)}"
            )
        w = weights.to(per_row.dtype).unsqueeze(1)
        per_row, known = per_row * w, known * w
    count = n.clamp(min=1)
    return per_row.sum(dim=0) / count, known.sum(dim=0) / count


def validate_pos_ratio(pos_ratio: PosRatio | None, num_labels: int) -> torch.Tensor:
    """Turn a float (broadcast to all labels) or a length-L sequence into a float64 tensor."""
    if pos_ratio is None:
        raise ValueError("pos_ratio is required for AUC losses (positive ratio per label)")
    ratio = torch.as_tensor(pos_ratio, dtype=torch.float64).flatten()
    if ratio.numel() == 1:
        ratio = ratio.expand(num_labels)
    if ratio.numel() != num_labels:
        raise ValueError(
            f"pos_ratio must be a float or have one value per label ({num_labels}), "
            f"got {ratio.numel()} values: {ratio.tolist()}"
        )
    bad = [r for r in ratio.tolist() if not (0.0 < r < 1.0)]
    if bad:
        raise ValueError(f"pos_ratio values must lie strictly in (0, 1), got {bad[0]!r}")
    return ratio.clone()


def auc_square_loss(
    scores: torch.Tensor,
    targets: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    pos_ratio: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """CODASCA eq. (2) on scores h in (0, 1), summed over labels (functional core);
    ``weights`` (B,): one per row, see the module docstring."""
    pos, neg, n = _class_masks(targets)
    p = pos_ratio
    per_row = (
        (1 - p) * (scores - a) ** 2 * pos
        + p * (scores - b) ** 2 * neg
        + 2 * (1 + alpha) * (p * scores * neg - (1 - p) * scores * pos)
    )
    row_sum, share = _weighted(per_row, pos + neg, n, weights)
    return (row_sum - share * p * (1 - p) * alpha**2).sum()


def auc_margin_loss(
    scores: torch.Tensor,
    targets: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    pos_ratio: torch.Tensor,
    margin: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """AUC-margin (AUC-M) min-max loss on scores h in (0, 1), summed over labels;
    ``weights`` (B,): one per row, see the module docstring."""
    pos, neg, n = _class_masks(targets)
    p = pos_ratio
    per_row = (
        (1 - p) * (scores - a) ** 2 * pos
        + p * (scores - b) ** 2 * neg
        + 2 * alpha * (p * scores * neg - (1 - p) * scores * pos)
    )
    row_sum, share = _weighted(per_row, pos + neg, n, weights)
    constant = 2 * alpha * p * (1 - p) * margin - p * (1 - p) * alpha**2
    return (row_sum + share * constant).sum()


class _AUCLoss(nn.Module):
    """Shared state of the AUC losses: (a, b, alpha) per label and the positive ratio."""

    is_minimax: bool = True
    dual_min: float | None = None  # lower bound of alpha; None = unconstrained

    def __init__(self, num_labels: int, pos_ratio: PosRatio | None) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.num_labels = num_labels
        self.a = nn.Parameter(torch.zeros(num_labels))
        self.b = nn.Parameter(torch.zeros(num_labels))
        self.alpha = nn.Parameter(torch.zeros(num_labels))
        # Not persistent: p is set by the coordinator each run, never averaged as a weight.
        ratio = validate_pos_ratio(pos_ratio, num_labels).to(torch.get_default_dtype())
        self.register_buffer("pos_ratio", ratio, persistent=False)

    def set_pos_ratio(self, pos_ratio: PosRatio | None) -> None:
        """Replace p (e.g. with the global prevalence), keeping dtype and device."""
        self.pos_ratio.copy_(validate_pos_ratio(pos_ratio, self.num_labels))

    @property
    def primal_params(self) -> list[nn.Parameter]:
        return [self.a, self.b]

    @property
    def dual_params(self) -> list[nn.Parameter]:
        return [self.alpha]

    def project_(self) -> None:
        """Project alpha onto its feasible set after an ascent step; no-op when unconstrained."""


class AUCMarginLoss(_AUCLoss):
    """AUC-margin loss (LibAUC AUCMLoss semantics, margin m, alpha >= 0); the default loss."""

    dual_min = 0.0

    def __init__(
        self, num_labels: int = 1, *, pos_ratio: PosRatio | None, margin: float = 1.0
    ) -> None:
        super().__init__(num_labels, pos_ratio)
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        self.margin = float(margin)

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits, targets = _as_2d(logits, targets, self.num_labels)
        return auc_margin_loss(
            torch.sigmoid(logits),
            targets,
            self.a,
            self.b,
            self.alpha,
            self.pos_ratio,
            self.margin,
            weights,
        )

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp alpha to >= 0 in place (the margin loss's dual feasible set)."""
        self.alpha.clamp_(min=0.0)

    def extra_repr(self) -> str:
        return f"num_labels={self.num_labels}, margin={self.margin}"


class AUCSquareLoss(_AUCLoss):
    """The CODASCA paper's square-loss min-max objective, eq. (2); alpha is unconstrained."""

    def __init__(self, num_labels: int = 1, *, pos_ratio: PosRatio | None) -> None:
        super().__init__(num_labels, pos_ratio)

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits, targets = _as_2d(logits, targets, self.num_labels)
        return auc_square_loss(
            torch.sigmoid(logits), targets, self.a, self.b, self.alpha, self.pos_ratio, weights
        )

    def extra_repr(self) -> str:
        return f"num_labels={self.num_labels}"


class CrossEntropyLoss(nn.Module):
    """BCE-with-logits averaged over the known (non-NaN) entries; the FedAvg baseline."""

    is_minimax: bool = False

    def __init__(self, num_labels: int = 1) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.num_labels = num_labels

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits, targets = _as_2d(logits, targets.to(logits.dtype), self.num_labels)
        known = ~torch.isnan(targets)
        clean = torch.where(known, targets, torch.zeros_like(targets))
        if not torch.all((clean >= 0) & (clean <= 1)):
            raise ValueError("cross-entropy targets must lie in [0, 1] or be NaN")
        per_entry = nn.functional.binary_cross_entropy_with_logits(logits, clean, reduction="none")
        weights = known.to(logits.dtype)
        return (per_entry * weights).sum() / weights.sum().clamp(min=1)

    def extra_repr(self) -> str:
        return f"num_labels={self.num_labels}"


def build_loss(name: str, num_labels: int = 1, pos_ratio: PosRatio | None = None) -> nn.Module:
    """Loss by CLI name; `pos_ratio` is required for the AUC losses and ignored for `ce`."""
    if name == "auc_margin":
        return AUCMarginLoss(num_labels, pos_ratio=pos_ratio)
    if name == "auc_square":
        return AUCSquareLoss(num_labels, pos_ratio=pos_ratio)
    if name == "ce":
        return CrossEntropyLoss(num_labels)
    raise ValueError(f"unknown loss {name!r}; valid names: {', '.join(LOSSES)}")

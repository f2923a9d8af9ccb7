"""Per-site heterogeneity signals of one round, from the updates the sites sent.

Δw_k = w_k − w (network weights only). A site whose update points away from the mean update
(low cosine, high drift) sees data unlike the others'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from fed_auc.trainable import WEIGHT, Tensors

if TYPE_CHECKING:
    from fed_auc.exchange import Reply

GRADIENT = "g/"


def site_update(sent: Tensors, returned: Tensors) -> torch.Tensor | None:
    """A site's network update as one vector: w_k − w for iterates, −g for gradients.

    None when the reply carries neither (e.g. a gradient-collection phase of a backend that
    sends something else).
    """
    names = [n for n in sent if n.startswith(WEIGHT)]
    if names and all(n in returned for n in names):
        return torch.cat([(returned[n].float() - sent[n].float()).flatten() for n in names])
    if names and all(GRADIENT + n in returned for n in names):
        return torch.cat([-returned[GRADIENT + n].float().flatten() for n in names])
    return None


def update_signals(updates: Mapping[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """update_norm ‖Δ_k‖, drift ‖Δ_k − mean Δ‖ and cosine(Δ_k, mean Δ) for every site."""
    if not updates:
        return {}
    mean = torch.stack(list(updates.values())).mean(dim=0)
    mean_norm = float(mean.norm())
    out = {}
    for site, delta in updates.items():
        norm = float(delta.norm())
        denominator = norm * mean_norm
        out[site] = {
            "update_norm": norm,
            "drift": float((delta - mean).norm()),
            "cosine": float(delta @ mean) / denominator if denominator > 0 else 0.0,
        }
    return out


def tensor_norm(tensors: Tensors, prefix: str) -> float | None:
    """‖·‖ over the tensors with a prefix (e.g. CODASCA's Δc_k), None if there are none."""
    parts = [t.float().flatten() for n, t in tensors.items() if n.startswith(prefix)]
    return float(torch.cat(parts).norm()) if parts else None


def phase_signals(sent: Tensors, replies: Sequence[Reply]) -> dict[str, dict[str, float]]:
    """Update norm, drift and cosine of every site whose reply updates the network (none
    for a phase that collects gradients only)."""
    updates = {r.site: site_update(sent, r.tensors) for r in replies}
    return update_signals({site: u for site, u in updates.items() if u is not None})

"""FedAvg: local SGD (cross-entropy by default, or SGDA on an AUC loss), averaged by examples.

It is Local SGDA with the other baseline's conventions: any loss, and each site weighted by
its number of training examples (McMahan et al. 2017) instead of uniformly.
"""

from __future__ import annotations

from fed_auc.algorithms.local_sgda import LocalSGDA


class FedAvg(LocalSGDA):
    name = "fedavg"
    needs_minimax_loss = False

    def __init__(self, site_weighting: str = "examples", **hyperparameters) -> None:
        super().__init__(site_weighting=site_weighting, **hyperparameters)

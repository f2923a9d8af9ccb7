"""Federated training backends behind one contract, registered by name (``--algorithm``)."""

from __future__ import annotations

from typing import Any

from fed_auc.algorithms.base import Backend, Broadcast, Reply
from fed_auc.algorithms.coda_plus import CODAPlus
from fed_auc.algorithms.codasca import CODASCA
from fed_auc.algorithms.fed_norm_sgda import FedNormSGDA, FedNormSGDAPlus
from fed_auc.algorithms.fedavg import FedAvg
from fed_auc.algorithms.fedsgda import FedSGDAMB, FedSGDASTORM
from fed_auc.algorithms.local_sgda import LocalSGDA

ALGORITHMS: dict[str, type[Backend]] = {
    cls.name: cls
    for cls in (
        CODASCA,
        CODAPlus,
        LocalSGDA,
        FedAvg,
        FedSGDAMB,
        FedSGDASTORM,
        FedNormSGDA,
        FedNormSGDAPlus,
    )
}


def build_backend(name: str, **hyperparameters: Any) -> Backend:
    """The backend registered as ``name``, with its hyperparameters validated."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name](**hyperparameters)


__all__ = ["ALGORITHMS", "Backend", "Broadcast", "Reply", "build_backend"]

"""Federated training backends behind one contract, registered by name (``--algorithm``)."""

from __future__ import annotations

import inspect
from typing import Any

from fed_auc.algorithms.base import Backend
from fed_auc.algorithms.coda_plus import CODAPlus
from fed_auc.algorithms.codasca import CODASCA
from fed_auc.algorithms.fed_norm_sgda import FedNormSGDA, FedNormSGDAPlus
from fed_auc.algorithms.fedavg import FedAvg
from fed_auc.algorithms.fedsgda import FedSGDAMB, FedSGDASTORM
from fed_auc.algorithms.local_sgda import LocalSGDA
from fed_auc.exchange import Broadcast, Reply

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
    valid = hyperparameter_names(ALGORITHMS[name])
    unknown = sorted(set(hyperparameters) - valid)
    if unknown:
        raise ValueError(
            f"algorithm {name!r} has no hyperparameter {unknown[0]!r}; valid: {sorted(valid)}"
        )
    return ALGORITHMS[name](**hyperparameters)


def hyperparameter_names(cls: type[Backend]) -> set[str]:
    """Keyword arguments a backend accepts, through its ``**common`` chain to ``Backend``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and issubclass(klass, Backend):
            names |= {
                p.name
                for p in inspect.signature(klass.__init__).parameters.values()
                if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
            }
    return names


__all__ = ["ALGORITHMS", "Backend", "Broadcast", "Reply", "build_backend", "hyperparameter_names"]

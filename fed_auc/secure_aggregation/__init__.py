"""Secure aggregation (SecAgg+ structure): the coordinator learns only sums of the sites'
masked replies. ``client`` runs on the nodes, ``server`` on the coordinator, ``encoding`` says
what is summed; the transports only carry ``messages``."""

from fed_auc.secure_aggregation.client import SecureClient
from fed_auc.secure_aggregation.messages import CONFIG_KEY, SecureAggregationError
from fed_auc.secure_aggregation.server import SecureServer, default_threshold

__all__ = [
    "CONFIG_KEY",
    "SecureAggregationError",
    "SecureClient",
    "SecureServer",
    "default_threshold",
]

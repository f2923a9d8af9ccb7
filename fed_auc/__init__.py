"""fed-auc: federated deep AUC maximization on medical images."""

__version__ = "0.1.0"

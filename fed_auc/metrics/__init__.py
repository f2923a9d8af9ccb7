"""Pure statistics on scores and labels: AUC with CIs, ROC curves, operating points, pooled AUC
from binned counts, bootstrap and calibration. Used by the node, the coordinator, evaluation
jobs and the dashboard alike.
"""

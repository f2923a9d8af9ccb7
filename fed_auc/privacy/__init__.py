"""What leaves a hospital and what protects it: update-level DP (``update_dp``), DP-SGD
(``dp_sgd``), their accountant, ledger and planner (``accounting``), and secure aggregation's
primitives (``secure``).
"""

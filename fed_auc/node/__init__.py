"""A hospital's node: its local state and train / evaluate (``node``), built from plain settings
(``setup``, ``build``), and its report for evaluation jobs (``report``).
"""

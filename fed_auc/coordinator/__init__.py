"""The round loop (``loop``): screening replies, the plain and the secure phase, aggregation,
checkpoints, round scores, heterogeneity signals, robust aggregation, local-work plans and the
choice of the exported round.
"""

"""Secure aggregation (SecAgg, Bonawitz et al. 2017, every pair of sites masking: not SecAgg+'s
sparse graph): the coordinator learns only sums of the sites' masked replies. ``client`` runs
on the nodes, ``server`` on the coordinator, ``encoding`` says what is summed, ``rounds`` runs
one phase of a round with it; the transports only carry ``messages``. Nothing is imported
here, so a run without it never loads the cryptography libraries."""

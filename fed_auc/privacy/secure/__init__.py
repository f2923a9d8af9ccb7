"""Secure aggregation with SecAgg+'s structure (Bell et al. 2020, on Bonawitz et al.'s SecAgg,
2017): each site masks with and shares its secrets with its neighbours on a k-regular graph
(``graph``), t-of-neighbourhood Shamir shares, survival of sites that drop after sending; the
coordinator learns only sums of the sites' masked replies. ``client`` runs on the nodes,
``server`` on the coordinator, ``encoding`` says what is summed, ``rounds`` runs one phase of
a round with it; the transports only carry ``messages``. Nothing is imported
here, so a run without it never loads the cryptography libraries."""

"""Secure aggregation (SecAgg+ structure): the coordinator learns only sums of the sites'
masked replies. ``client`` runs on the nodes, ``server`` on the coordinator, ``encoding``
says what is summed, ``rounds`` runs one phase of a round with it; the transports only
carry ``messages``. Nothing is imported here, so a run without it never loads the
cryptography libraries."""

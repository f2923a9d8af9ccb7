"""Fault injection → RELIABILITY.md: crashes, failing nodes, hostile replies, bad inputs, DP cost.

    python -m benchmarks.reliability [--kills 5] [--out RELIABILITY.md]
    python -m benchmarks.reliability --quick --markdown benchmarks/results/reliability.md

``--quick``: one kill, one flaky run, every hostile kind, 3 rounds per run. With ``--quick`` or
``--markdown`` it writes RELIABILITY.md only if ``--out`` says so (run_all.py splices the
fragment into RELIABILITY.md between its markers).

Every number in the table comes from what this script ran: runs killed with SIGKILL at a
random moment and resumed (compared with the uninterrupted run of the same seed), runs with
nodes that fail at random, every kind of hostile reply, a corpus of bad inputs (each must get
an error naming what and where), and the AUC cost of client-side DP.

Modules: ``faults`` (runs killed and resumed, failing nodes, hostile replies), ``bad_inputs``
(the corpus of broken configs, files and images), ``report`` (the DP cost, the tables, main).
"""

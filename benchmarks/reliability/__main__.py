"""``python -m benchmarks.reliability``: see ``benchmarks.reliability.report``."""

from benchmarks.reliability.report import main

main()

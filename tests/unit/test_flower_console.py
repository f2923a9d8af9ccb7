"""What the consoles of ``fed-auc coordinator`` and ``fed-auc node`` say around a run (issue
37, "Faults"): Flower's lines relayed without colour codes, a restarted node's refusal while
the coordinator still holds its previous session, and the end of a run at the node."""

from __future__ import annotations

import threading

from fed_auc.transport.flower.processes import follow_log, relay

# Flower 1.42's own lines, as `flwr run --stream` and the SuperLink write them to a pipe
COLOURED = [
    "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `11519777184962352223`\n",
    "\x1b[92mINFO \x1b[0m:      Start `flwr-serverapp` process\n",
    "\x1b[93mWARNING \x1b[0m:   Connection attempt failed, retrying in 0.33 seconds\n",
]
PLAIN = [
    "INFO :      Starting logstream for run_id `11519777184962352223`",
    "INFO :      Start `flwr-serverapp` process",
    "WARNING :   Connection attempt failed, retrying in 0.33 seconds",
]


def test_relayed_flower_lines_carry_no_colour_codes(tmp_path):
    shown: list[str] = []
    relay(iter(COLOURED), shown.append)  # the `flwr run` stream
    assert shown == PLAIN
    log = tmp_path / "superlink.log"  # a followed log, as the progress file is
    log.write_text("".join(COLOURED))
    done = threading.Event()
    done.set()
    followed: list[str] = []
    follow_log(log, followed.append, done)
    assert followed == PLAIN

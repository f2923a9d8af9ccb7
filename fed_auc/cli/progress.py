"""The progress bar of ``fed-auc simulate`` and ``demo``: every round counts, the warm-up's
too (named as such), and the time left is the recent rounds' pace times the rounds left.

tqdm's own estimate divides by an average that starts with the first update: when that one
carries the start-up and a warm-up it never counted, a 60-round run sat at 0/60 and then
predicted hours for minutes. Here the first interval of each phase (start-up, the switch from
warm-up to the AUC phase) is left out of the pace, which is the mean of the last ``RECENT``
intervals: rounds that evaluate and rounds that do not both weigh in.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from fed_auc.cli.text import fmt

RECENT = 10  # rounds whose mean pace predicts the rest
WARMUP = "warm-up (fedavg + cross-entropy)"
BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class RoundPace:
    """Rounds done of ``total`` and the time the rest will take, from the round timings."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.done, self.clock = total, 0, clock
        self._last = clock()
        self._phase: str | None = None
        self._intervals: list[float] = []

    def tick(self, phase: str) -> None:
        """One round of ``phase`` finished now; a phase's first round is no pace sample (it
        carries the start-up, or the switch between phases)."""
        now = self.clock()
        if phase == self._phase:
            self._intervals = [*self._intervals, now - self._last][-RECENT:]
        self._phase, self._last = phase, now
        self.done += 1

    def remaining_s(self) -> float | None:
        """Seconds until the last round; None until a pace is known."""
        if not self._intervals:
            return None
        return sum(self._intervals) / len(self._intervals) * max(self.total - self.done, 0)


class RoundProgress:
    """The bar: the phase (warm-up, then ``name``: the algorithm) and the positive class once
    known, every round counted, the time left from ``RoundPace``, the last round's AUCs."""

    def __init__(
        self,
        total: int,
        name: str,
        warmup: bool = False,
        clock: Callable[[], float] = time.monotonic,
        file=None,
    ) -> None:
        """``warmup``: the run starts with its warm-up; ``file``: where the bar goes (None:
        standard error as it is now)."""
        from tqdm import tqdm

        self.pace = RoundPace(total, clock)
        self.name = name
        self.phase = WARMUP if warmup else name
        self.positive_class: str | None = None
        file = sys.stderr if file is None else file
        self.bar = tqdm(  # every round redraws (rounds take seconds; tqdm would skip some)
            total=total, desc=self.phase, unit="round", file=file, bar_format=BAR,
            mininterval=0, miniters=1,
        )  # fmt: skip

    def name_class(self, positive_class: str) -> None:
        """The class every AUC on the bar is about, shown beside the phase at once."""
        self.positive_class = positive_class
        self.bar.set_description_str(self._desc(self.phase))

    def warmup_round(self, record: Any) -> None:
        self._round(WARMUP, record)

    def round(self, record: Any) -> None:
        self._round(self.name, record)

    def _desc(self, phase: str) -> str:
        positive = "" if self.positive_class is None else f", positive class {self.positive_class}"
        return phase + positive

    def _round(self, phase: str, record: Any) -> None:
        self.phase = phase
        self.pace.tick(phase)
        left = self.pace.remaining_s()
        shown = "estimating time left" if left is None else f"≈{_duration(left)} left"
        if self.pace.done >= self.pace.total:
            shown = "done"
        self.bar.set_description_str(self._desc(phase), refresh=False)
        self.bar.set_postfix_str(
            f"{shown}, test AUC pooled {fmt(record.global_auc)}, "
            f"worst site {fmt(record.worst_site_auc)}",
            refresh=False,
        )
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``1 h 05 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"

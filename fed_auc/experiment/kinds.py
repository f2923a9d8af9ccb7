"""The kinds of value an option takes, each a check in one style: ``check(name, value)`` raises
``ValueError("NAME must be ..., got VALUE")`` and ``describe()`` says what is expected, for the
flag's help and the option tables. ``None`` never reaches a check: the field's type says
whether an option may be unset (``fed_auc.experiment.checks.check_type``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any


@dataclass(frozen=True)
class OneOf:
    """One of a fixed list of names (``choices`` may be a callable, read when checked, for a
    registry such as the backends)."""

    choices: Sequence[Any] | Callable[[], Sequence[Any]]

    def values(self) -> list[Any]:
        return list(self.choices() if callable(self.choices) else self.choices)

    def __call__(self, name: str, value: Any) -> None:
        if value not in self.values():
            raise ValueError(f"{name} must be one of {self.values()}, got {value!r}")

    def describe(self) -> str:
        return ", ".join(f"`{choice}`" for choice in self.values())


@dataclass(frozen=True)
class Integer:
    """An integer in [low, high] (high None: no upper bound)."""

    low: int
    high: int | None = None

    def __call__(self, name: str, value: Any) -> None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= self.low
        if not ok or (self.high is not None and value > self.high):
            raise ValueError(f"{name} must be an integer {self.describe()}, got {value!r}")

    def describe(self) -> str:
        upper = f" and ≤ {self.high}" if self.high is not None else ""
        return f"≥ {self.low}{upper}"


@dataclass(frozen=True)
class Interval:
    """A finite number in an interval; ``closed`` says which ends belong to it ("[)" etc.)."""

    low: float
    high: float = math.inf
    closed: str = "[]"

    def __call__(self, name: str, value: Any) -> None:
        number = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
        if number:
            above = value >= self.low if self.closed[0] == "[" else value > self.low
            below = value <= self.high if self.closed[1] == "]" else value < self.high
        if not (number and above and below):
            raise ValueError(f"{name} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        if math.isinf(self.high):
            return f"{'≥' if self.closed[0] == '[' else '>'} {_number(self.low)}"
        return f"in {self.closed[0]}{_number(self.low)}, {_number(self.high)}{self.closed[1]}"


@dataclass(frozen=True)
class Parsed:
    """Text that ``parse`` reads (it raises ``ValueError`` naming what it expected), such as
    ``dirichlet:0.5`` or ``best_val:5``; ``form`` says what it looks like."""

    parse: Callable[[Any], Any]
    form: str

    def __call__(self, name: str, value: Any) -> None:
        try:
            self.parse(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be {self.form}, got {value!r} ({exc})") from None

    def describe(self) -> str:
        return self.form


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)

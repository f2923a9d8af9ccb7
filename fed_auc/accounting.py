"""A site's (ε, δ), from Google's ``dp-accounting`` (RDP accountant), for either DP mode.

Example-level DP-SGD (``fed_auc.dp_sgd``) counts local steps; update-level DP
(``fed_auc.privacy``) counts one Gaussian mechanism per block of each update a site sends.

The node never computes ε itself: it records what it released as ``dp-accounting`` events
and asks the library. One local step on a Poisson-sampled batch (each row in with
probability ≤ q) whose gradients were evaluated k times (k = 2 when a backend evaluates the
same batch at two points: FedSGDA-STORM's anchor, Fed-Norm-SGDA+'s snapshot), each time
clipped to C and noised with σ·C, is ONE subsampled Gaussian mechanism of noise multiplier
σ/√k (k Gaussians of sensitivity C on the same rows compose to one of sensitivity C·√k). A
full pass over the local split (FedSGDA's full gradients) is a Gaussian mechanism with q = 1.

The ledger is a per-site, append-only file: a release is counted once, even if the
coordinator later drops the reply or the node restarts, because the noisy update did leave
the node. A release is keyed by what determines it entirely (round, phase, the broadcast and
the sampler's state); the same key reproduces the same bytes (the noise is seeded by the
key), so releasing it again costs nothing and is not counted twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fed_auc.io import save_json

if TYPE_CHECKING:
    import dp_accounting

    from fed_auc.algorithms.base import Broadcast

LEDGER_FILE = "privacy_ledger.json"


class BudgetSpent(RuntimeError):
    """The site's privacy budget does not allow another release: it stops training."""


@dataclass(frozen=True)
class Step:
    """``count`` subsampled Gaussian mechanisms with sampling rate ``q`` and noise ``sigma``."""

    q: float
    sigma: float
    count: int = 1

    def event(self) -> dp_accounting.DpEvent:
        dp_accounting = _library()
        gaussian = dp_accounting.GaussianDpEvent(self.sigma)
        single = gaussian if self.q >= 1 else dp_accounting.PoissonSampledDpEvent(self.q, gaussian)
        return dp_accounting.SelfComposedDpEvent(single, self.count)


def epsilon(steps: Iterable[Step], delta: float) -> float:
    """ε at ``delta`` of all ``steps`` composed (0 when nothing was released)."""
    merged: Counter[tuple[float, float]] = Counter()
    for step in steps:
        merged[(step.q, step.sigma)] += step.count
    if not merged:
        return 0.0
    dp_accounting = _library()
    accountant = dp_accounting.rdp.RdpAccountant()
    with _quiet():  # composing evaluates the RDP orders: that is where the warnings arise
        accountant.compose(
            dp_accounting.ComposedDpEvent([Step(q, s, n).event() for (q, s), n in merged.items()])
        )
        return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def noise_for_epsilon(target_epsilon: float, delta: float, q: float, steps: int) -> float:
    """σ such that ``steps`` steps at rate ``q`` spend ``target_epsilon`` at ``delta``
    (``dp_accounting.calibrate_dp_mechanism``, the library's own search; a second of RDP
    evaluations, so remembered per process: nodes of one site restart with the same σ)."""
    dp_accounting = _library()
    with _quiet():
        return _calibrate(dp_accounting, target_epsilon, delta, q, steps)


def _calibrate(dp_accounting, target_epsilon: float, delta: float, q: float, steps: int) -> float:
    return float(
        dp_accounting.calibrate_dp_mechanism(
            dp_accounting.rdp.RdpAccountant,
            lambda sigma: Step(q, sigma, steps).event(),
            target_epsilon,
            delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
        )
    )


class PrivacyLedger:
    """What one site has released, on disk beside its local state; ε on demand."""

    def __init__(self, state_dir: str | Path, delta: float) -> None:
        self.path = Path(state_dir) / LEDGER_FILE
        self.delta = delta
        self.releases: dict[str, dict] = {}
        self.spent_at: int | None = None  # the round whose release would have gone over
        self._epsilon: float | None = None
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            self.releases = saved["releases"]
            self.spent_at = saved.get("spent_at")

    def steps(self) -> list[Step]:
        return [Step(*s) for release in self.releases.values() for s in release["steps"]]

    def epsilon(self, extra: Iterable[Step] = ()) -> float:
        """ε of what was released, plus ``extra`` steps (each call asks the library once:
        about a second on a loaded machine, so the ledger's own ε is remembered)."""
        extra = list(extra)
        if extra:
            return epsilon([*self.steps(), *extra], self.delta)
        if self._epsilon is None:
            self._epsilon = epsilon(self.steps(), self.delta)
        return self._epsilon

    def __contains__(self, key: str) -> bool:
        return key in self.releases

    def record(
        self, key: str, round_: int, phase: str, steps: Iterable[Step], spent: float
    ) -> None:
        """Count a release (once per key; ``spent`` = ε with it) and write the ledger before
        the reply leaves."""
        if key not in self.releases:
            self.releases[key] = {
                "round": round_,
                "phase": phase,
                "steps": [[s.q, s.sigma, s.count] for s in steps],
            }
            self._epsilon = spent
            self._save()

    def mark_spent(self, round_: int) -> None:
        self.spent_at = round_
        self._save()

    def check_open(self, target_epsilon: float | None) -> None:
        """Raise ``BudgetSpent`` if an earlier round found the budget spent."""
        if self.spent_at is not None:
            raise BudgetSpent(
                f"privacy budget spent at round {self.spent_at}: ε = {self.epsilon():.3g} of "
                f"{target_epsilon} (δ = {self.delta}); site stopped training"
            )

    def spend(
        self, key: str, round_: int, phase: str, steps: Iterable[Step], target: float | None
    ) -> float:
        """Count the release ``key`` (free when already counted: the same key is the same
        bytes) and return ε with it; refuse it (``BudgetSpent``, and the site stops) when it
        would take ε past ``target``."""
        steps = [] if key in self else list(steps)
        before = self.epsilon()
        after = self.epsilon(steps) if steps else before
        if target is not None and after > target:
            self.mark_spent(round_)
            raise BudgetSpent(
                f"privacy budget spent: this update would take ε from {before:.3g} to "
                f"{after:.3g} > target {target} (δ = {self.delta}); it was not sent and the "
                "site stops training"
            )
        self.record(key, round_, phase, steps, after)
        return self.epsilon()

    def _save(self) -> None:
        save_json({"delta": self.delta, "releases": self.releases, "spent_at": self.spent_at},
                  self.path)  # fmt: skip


def release_key(seed: int, site: str, broadcast: Broadcast, sampler: dict) -> str:
    """What fixes a release entirely: seed, site, round, phase, the broadcast's tensors and
    the sampler's state (``sampler``: its ``state_dict()`` before the update). The noise is
    seeded by it, so the same key is the same bytes and a new key draws fresh noise."""
    digest = hashlib.sha256(f"{seed}:{site}:{broadcast.round}:{broadcast.phase}".encode())
    for name in sorted(broadcast.tensors):
        digest.update(name.encode())
        digest.update(broadcast.tensors[name].detach().contiguous().numpy().tobytes())
    digest.update(sampler["generator"].numpy().tobytes())
    return digest.hexdigest()


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence the RDP accountant's warnings about the orders it skips (it says so for the
    lowest orders at small σ and still bounds ε with the others)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _library():
    """``dp_accounting``, installed with the ``privacy`` extra (only DP-SGD needs it)."""
    try:
        import dp_accounting
    except ImportError:
        raise ImportError(
            "differential privacy's accountant (dp = 'example', or dp = 'update' with noise) "
            "needs Google's dp-accounting: pip install 'fed-auc[privacy]'"
        ) from None
    return dp_accounting


def check_delta(delta: float, where: str = "dp_delta") -> None:
    if not (isinstance(delta, float | int) and 0 < delta < 1 and math.isfinite(delta)):
        raise ValueError(f"{where} must be in (0, 1), got {delta!r}")

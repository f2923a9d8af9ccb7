"""A site's (ε, δ), from Google's ``dp-accounting`` (RDP accountant), for either DP mode.

Example-level DP-SGD (``fed_auc.privacy.dp_sgd``) counts local steps; update-level DP
(``fed_auc.privacy.update_dp``) counts one Gaussian mechanism per block of each update a site sends.
Each mode's ε is for its own neighbouring relation (``RELATIONS``): DP-SGD's for adding or
removing one training example; update-level DP's for replacing one hospital's whole training
data (which sites replied is public, so "this hospital's data vs none" hides nothing: the
relation is replace-one, sensitivity 2C, so its Gaussian's multiplier is σ/2).

The node never computes ε itself: it records what it released as ``dp-accounting`` events
and asks the library. One local step on a Poisson-sampled batch (each row in with
probability ≤ q) whose gradients were evaluated k times (k = 2 when a backend evaluates the
same batch at two points: FedSGDA-STORM's anchor, Fed-Norm-SGDA+'s snapshot), each time
clipped to C and noised with σ·C, is ONE subsampled Gaussian mechanism of noise multiplier
σ/√k (k Gaussians of sensitivity C on the same rows compose to one of sensitivity C·√k). A
full pass over the local split (FedSGDA's full gradients) is a Gaussian mechanism with q = 1.

The ledger is a per-site, append-only file: a release is counted once, even if the
coordinator later drops the reply or the node restarts, because the noisy update did leave
the node. A release is keyed by everything that determines its computation (``release_key``:
round, phase, the broadcast's tensors and config, the node's settings, the run's setup and
its data's digest, the sampler's state and the local state); the same key reproduces the
same bytes, so answering it again costs nothing and is not counted twice, while any other
computation of the request is a new key: fresh noise, charged as a new release (the same
round asked again with another broadcast spends more ε). The run's setup, its data and the
ledger's δ are fixed at its first release (``run_setup``): a request that changes them is
refused (``SetupChanged``), never re-keyed, and past releases keep the δ they were counted at.

The noise itself is drawn from a secret only the node holds (``NodeSecret``): random bytes
created once in its state directory, never sent, combined with the release key through
HMAC-SHA256. A resumed run reproduces itself on that node; the coordinator, holding the
run's config, its broadcasts, the registrations and the store, cannot regenerate the noise
and subtract it. DP-SGD's Poisson sampler draws from the same secret: amplification by
subsampling holds only while the sample is secret.

The planner (``example_plan``, ``update_plan``) counts what a backend really releases in a
round (its phases, full passes and gradients evaluated twice, from
``Backend.private_draws``; a personal model's extra steps; a site's own local steps) so a
target ε calibrates σ for the run that will run, and a budget that cannot last is refused
before round 1 with the ε it would need.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fed_auc.exchange import NodeRefused
from fed_auc.io import save_json
from fed_auc.privacy.secure.messages import CONFIG_KEY as SECURE_CONFIG_KEY

if TYPE_CHECKING:
    import dp_accounting

    from fed_auc.exchange import Broadcast

LEDGER_FILE = "privacy_ledger.json"
SECRET_FILE = "dp_secret.bin"  # the node's noise secret: never sent, never in the store
SECRET_BYTES = 32

# The neighbouring relation each DP mode's ε is for (named wherever an ε is shown).
RELATIONS = {
    "example": "add or remove one training example (image) of a site",
    "update": "replace one hospital's whole training data",
}
# Update-level DP's sensitivity under replace-one: two clipped moves differ by up to 2C.
UPDATE_SENSITIVITY = 2.0


class BudgetSpent(NodeRefused):
    """The site's privacy budget does not allow another release: it stops training."""

    status = "budget_spent"


class SetupChanged(NodeRefused):
    """A request for a run that changes what its releases were computed from (its setup,
    its data, or its ledger's δ): refused, never re-keyed or rewritten."""

    status = "setup_changed"


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


@dataclass(frozen=True)
class Mechanism:
    """``count`` Gaussian mechanisms planned at sampling rate ``q`` whose noise multiplier is
    σ · ``scale`` (1/√k for gradients evaluated k times on the same rows; 1/(2√b) for an
    update of b blocks under replace-one)."""

    q: float
    scale: float
    count: int

    def step(self, sigma: float) -> Step:
        return Step(self.q, sigma * self.scale, self.count)


Plan = tuple[Mechanism, ...]


def _merged(mechanisms: Iterable[Mechanism], rounds: int) -> Plan:
    counts: Counter[tuple[float, float]] = Counter()
    for m in mechanisms:
        counts[(m.q, m.scale)] += m.count * rounds
    return tuple(Mechanism(q, scale, n) for (q, scale), n in sorted(counts.items()) if n)


def example_plan(draws: Iterable, sample_rate: float, rounds: int) -> Plan:
    """DP-SGD's plan: ``draws`` (``algorithms.base.Draw``: a Poisson batch or a full pass,
    evaluated k times) of one round, repeated for ``rounds`` rounds."""
    per_round = [
        Mechanism(sample_rate if d.kind == "batch" else 1.0, 1 / math.sqrt(d.evaluations), 1)
        for d in draws
    ]
    return _merged(per_round, rounds)


def update_plan(blocks_per_release: Iterable[int], rounds: int) -> Plan:
    """Update-level DP's plan: one release per phase of each round, of b blocks each (b
    Gaussians of sensitivity 2C compose to one of 2C·√b: multiplier σ/(2√b))."""
    per_round = [
        Mechanism(1.0, 1 / (UPDATE_SENSITIVITY * math.sqrt(b)), 1) for b in blocks_per_release if b
    ]
    return _merged(per_round, rounds)


def planned_epsilon(plan: Plan, sigma: float, delta: float) -> float:
    """ε at ``delta`` that the whole ``plan`` spends at noise multiplier ``sigma``."""
    return epsilon([m.step(sigma) for m in plan], delta)


@functools.lru_cache(maxsize=256)
def noise_for_plan(target_epsilon: float, delta: float, plan: Plan) -> float:
    """σ such that the whole ``plan`` spends ``target_epsilon`` at ``delta``
    (``dp_accounting.calibrate_dp_mechanism``, the library's own search)."""
    dp_accounting = _library()

    def event(sigma: float):
        return dp_accounting.ComposedDpEvent([m.step(sigma).event() for m in plan])

    with _quiet():
        return float(
            dp_accounting.calibrate_dp_mechanism(
                dp_accounting.rdp.RdpAccountant,
                event,
                target_epsilon,
                delta,
                dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            )
        )


def check_plan(
    plan: Plan, sigma: float, delta: float, target: float | None, site: str, rounds: int
) -> float:
    """ε the whole plan spends at ``sigma``; refuse, before round 1, a budget that cannot
    last the planned rounds (naming the site and the ε the plan would need)."""
    needed = planned_epsilon(plan, sigma, delta)
    if target is not None and needed > target * (1 + 1e-6):
        raise ValueError(
            f"site {site!r}: the privacy budget cannot last the run: {rounds} rounds of what "
            f"this backend releases need ε = {needed:.3g} at σ = {sigma:.3g} (δ = {delta}), "
            f"over target_epsilon = {target}; raise target_epsilon, lower rounds or local "
            "steps, or leave dp_noise out so σ is calibrated to the target"
        )
    return needed


class NodeSecret:
    """Random bytes only this node holds, created once in its state directory and never
    sent: the noise and DP-SGD's sample are drawn from HMAC-SHA256(secret, what is drawn),
    so nobody else can regenerate them, and a restarted node draws the same."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / SECRET_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            _create_secret(self.path)
        key = self.path.read_bytes()
        if len(key) != SECRET_BYTES:
            raise ValueError(
                f"{self.path}: a node's DP secret must be {SECRET_BYTES} bytes, found "
                f"{len(key)}; delete it only if this run has released nothing yet"
            )
        self._key = key

    def seed(self, purpose: str, key: str = "") -> int:
        """A 63-bit generator seed for ``purpose`` (e.g. "noise") and ``key`` (a release)."""
        digest = hmac.new(self._key, f"{purpose}\0{key}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "little") >> 1

    def __repr__(self) -> str:  # never print the secret
        return f"NodeSecret({str(self.path)!r})"


def _create_secret(path: Path) -> None:
    """Write the secret atomically, readable by the node's user only; a concurrent creator
    wins or loses whole (os.link refuses to replace)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def recorded_steps(state_dir: str | Path) -> list[Step]:
    """The releases a run's ledger in ``state_dir`` holds, as steps (none without a ledger):
    what a site's lifetime budget composes at its own δ."""
    path = Path(state_dir) / LEDGER_FILE
    if not path.exists():
        return []
    releases = json.loads(path.read_text())["releases"]
    return [Step(*s) for release in releases.values() for s in release["steps"]]


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
            if saved["delta"] != delta:  # the releases made report their ε at their own δ
                raise SetupChanged(
                    f"{self.path}: this run's releases were counted at δ = {saved['delta']}; "
                    f"a request at δ = {delta} is refused (δ is part of the ledger)"
                )
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


def release_key(
    site: str,
    broadcast: Broadcast,
    sampler: Mapping,
    settings: Mapping | None = None,
    local_state: Mapping | None = None,
) -> str:
    """What fixes a release's computation: site, round, phase, the broadcast's tensors and
    config, the node's ``settings`` (backend hyperparameters, batch, floors, DP), the
    sampler's state before the update and the local state it starts from. Secure
    aggregation's config is left out: it masks the reply after the release (post-processing).
    The same key is the same computation; any change is a new key, a new release."""
    digest = hashlib.sha256(f"{site}\0{broadcast.round}\0{broadcast.phase}".encode())
    config = {k: v for k, v in broadcast.config.items() if k != SECURE_CONFIG_KEY}
    _hash_into(digest, {"tensors": broadcast.tensors, "config": config})
    _hash_into(digest, {"settings": settings or {}, "sampler": sampler})
    _hash_into(digest, {"local_state": local_state or {}})
    return digest.hexdigest()


def _hash_into(digest, value) -> None:
    """Feed ``value`` (nested mappings, sequences, tensors, JSON scalars) to ``digest`` in a
    canonical order, tensors by dtype, shape and bytes."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, Mapping):
        digest.update(b"{")
        for name in sorted(value, key=str):
            digest.update(json.dumps(str(name)).encode())
            _hash_into(digest, value[name])
        digest.update(b"}")
    elif isinstance(value, list | tuple):
        digest.update(b"[")
        for item in value:
            _hash_into(digest, item)
        digest.update(b"]")
    else:
        digest.update(json.dumps(value, sort_keys=True, default=repr).encode())


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

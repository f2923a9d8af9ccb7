"""One node-side privacy contract: what a node asks of its DP mechanism, whichever it is.

The node (``fed_auc.node.node``) holds one ``NodePrivacy`` and never asks which mechanism it
is: no DP (``NodePrivacy`` itself), update-level DP (``UpdatePrivacy``) and DP-SGD
(``ExamplePrivacy``) answer the same calls in the same places of a round:

- ``sampler_seed`` and ``poisson``: how the node draws its batches (DP-SGD samples in secret);
- ``attach(...)``: plan with what only the built node knows (its backend, its draws);
- ``check_open(run)``: before a release, the budget is open and the run's setup is the one
  fixed at its first release (``run_setup``);
- ``update(trainable, key)``: the context of one local update (DP-SGD's private gradients);
- ``release(reply, broadcast, key, log)``: counted in the ledger, then what leaves;
- ``spent()``: the site's (ε, δ) so far in this run, None when nothing is accounted.

A new mechanism is one module: its settings, a ``NodePrivacy`` subclass, and its entry in
``MECHANISMS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fed_auc.exchange import Broadcast, Reply
from fed_auc.privacy.accounting import NodeSecret, PrivacyLedger
from fed_auc.privacy.dp_sgd import DrawLog, ExampleDP, PrivateTraining
from fed_auc.privacy.run_setup import fix_run_setup
from fed_auc.privacy.update_dp import PrivateUpdates, UpdateDP

if TYPE_CHECKING:
    from fed_auc.algorithms.base import Backend, Draw
    from fed_auc.data.sampling import BatchStream
    from fed_auc.node.compute import Compute
    from fed_auc.trainable import Trainable

    Draws = Callable[[int], list[Draw]]  # what one round draws, for a number of local steps


class NodePrivacy:
    """No DP: every reply leaves as computed, nothing is noised or counted. The base every
    mechanism overrides."""

    mode = "none"
    poisson = False  # batches drawn by Poisson sampling from the node's secret (DP-SGD)
    changes_reply = False  # what leaves differs from what was computed (the state follows it)

    def __init__(self, settings: Any, site: str, state_dir: str | Path) -> None:
        self.settings, self.site, self.state_dir = settings, site, Path(state_dir)
        # the noise (and DP-SGD's sample) come from a secret only this node holds
        self.secret = NodeSecret(state_dir) if self.accounted else None
        self.ledger: PrivacyLedger | None = None
        self.sigma: float | None = None

    @property
    def accounted(self) -> bool:
        """Whether releases are noised and counted in a ledger (they then have a key)."""
        return False

    def check_compute(self, compute: Compute) -> None:
        """Refuse a device or precision the mechanism cannot run in."""

    def sampler_seed(self, seed: int) -> int:
        return seed

    def attach(
        self, backend: Backend, batches: BatchStream, draws: Draws, local_steps: int | None
    ) -> None:
        """Plan with what only the built node knows: its ``backend``, its ``batches``, what a
        round ``draws`` for a number of local steps, the site's own ``local_steps`` (τ_i)."""

    def check_open(self, run: Mapping[str, Any] | None) -> None:
        """Before a release: the setup it is computed from (``run``: the setup's fields and the
        data's digest) is the one fixed at the run's first release, and the budget is open."""
        if self.ledger is None:
            return
        fix_run_setup(self.state_dir, run or {})
        self.ledger.check_open(self.settings.target_epsilon)

    @contextmanager
    def update(self, trainable: Trainable, key: str) -> Iterator[DrawLog | None]:
        """The context of one local update (the release ``key``)."""
        yield None

    def release(self, reply: Reply, broadcast: Broadcast, key: str, log: DrawLog | None) -> Reply:
        """What leaves for ``reply``, counted in the ledger before (``BudgetSpent``: nothing
        leaves). A new ``Reply`` when ``changes_reply``."""
        return reply

    def spent(self) -> tuple[float, float] | None:
        """The site's (ε, δ) in this run so far (its ledger); None when nothing is accounted."""
        if self.ledger is None:
            return None
        return self.ledger.epsilon(), self.ledger.delta

    def __repr__(self) -> str:
        return repr(self.settings)


class UpdatePrivacy(NodePrivacy):
    """Update-level DP (``update_dp``): each reply's blocks clipped and noised, site-level ε."""

    mode = "update"
    changes_reply = True

    @property
    def accounted(self) -> bool:
        return self.settings.accounted

    def attach(
        self, backend: Backend, batches: BatchStream, draws: Draws, local_steps: int | None
    ) -> None:
        self.backend = backend
        blocks = [len(backend.reply_layout(phase).prefixes) for phase in backend.phases]
        self.updates = PrivateUpdates(self.settings, self.site, self.state_dir, self.secret, blocks)
        updates = self.updates
        self.ledger, self.sigma, self.plan = updates.ledger, updates.sigma, updates.plan

    def release(self, reply: Reply, broadcast: Broadcast, key: str, log: DrawLog | None) -> Reply:
        blocks = self.backend.reply_blocks(reply, broadcast)
        return self.updates.release(reply, broadcast, blocks, key)


class ExamplePrivacy(NodePrivacy):
    """DP-SGD (``dp_sgd``): clipped, noised per-example gradients on a secret Poisson sample."""

    mode = "example"
    poisson = True

    @property
    def accounted(self) -> bool:
        return True

    def check_compute(self, compute: Compute) -> None:
        if compute.precision == "fp16":
            raise ValueError(
                f"site {self.site!r}: precision fp16 with dp = 'example' is not supported "
                "(per-example gradients have no loss scale); use bf16 or fp32"
            )

    def sampler_seed(self, seed: int) -> int:
        return self.secret.seed("sampler")

    def attach(
        self, backend: Backend, batches: BatchStream, draws: Draws, local_steps: int | None
    ) -> None:
        dp = self.settings
        if local_steps is not None:  # the site's own τ_i is what is planned for
            dp = dataclasses.replace(dp, local_steps=local_steps)
        self.training = PrivateTraining(
            dp, self.site, batches, self.state_dir, self.secret, draws(dp.local_steps)
        )
        training = self.training
        self.ledger, self.sigma, self.plan = training.ledger, training.sigma, training.plan

    @contextmanager
    def update(self, trainable: Trainable, key: str) -> Iterator[DrawLog | None]:
        with self.training.update(trainable, key) as log:
            yield log

    def release(self, reply: Reply, broadcast: Broadcast, key: str, log: DrawLog | None) -> Reply:
        return self.training.release(reply, broadcast, log)


MECHANISMS: dict[type, type[NodePrivacy]] = {UpdateDP: UpdatePrivacy, ExampleDP: ExamplePrivacy}


def node_privacy(settings: Any, site: str, state_dir: str | Path) -> NodePrivacy:
    """The node's mechanism for ``settings`` (an ``UpdateDP``, an ``ExampleDP``, or None)."""
    if settings is None:
        return NodePrivacy(None, site, state_dir)
    if type(settings) not in MECHANISMS:
        raise ValueError(f"site {site!r}: no DP mechanism for settings {settings!r}")
    return MECHANISMS[type(settings)](settings, site, state_dir)


def privacy_settings(example_dp: Mapping | None, update_dp: Mapping | None) -> Any:
    """The DP settings of a node setup's plain fields (DP-SGD's win, as they always have)."""
    if example_dp is not None:
        return ExampleDP(**example_dp)
    if update_dp is not None:
        return UpdateDP(**update_dp)
    return None

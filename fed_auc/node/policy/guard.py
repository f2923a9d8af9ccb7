"""The one check of every request against the node's policy, for both transports.

``NodeHost`` asks the guard before it answers: ``admit`` when a run's node is built (the
experiment, its backend, DP mode, ε, δ, the lifetime ε of the site's data, approval),
``train`` for each update (secure aggregation required), ``evaluate`` and ``report`` for
what a score may reveal (splits, smallest group, per-image scores). A request outside the
policy raises ``PolicyRefused`` naming the site, the rule and the file, is written to
``<state_dir>/policy/refusals.log`` and told on the node's console; the transports carry the
refusal to the coordinator as they carry a spent budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from fed_auc.data.base import SiteData
from fed_auc.data.digest import site_data_digest
from fed_auc.exchange import Broadcast, NodeRefused
from fed_auc.node.policy.approval import (
    dp_mode,
    experiment_digest,
    is_approved,
    remember_pending,
    summary,
)
from fed_auc.node.policy.lifetime import LifetimeLedger
from fed_auc.node.policy.records import record_refusal
from fed_auc.node.policy.rules import NodePolicy
from fed_auc.node.setup import NodeSetup
from fed_auc.privacy.secure.messages import CONFIG_KEY as SECURE_CONFIG_KEY

TRAINING_SPLIT = "train"


class PolicyRefused(NodeRefused):
    """A request outside the site's policy; ``rule`` is the policy key that refused it."""

    status = "policy"

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class NotApproved(PolicyRefused):
    """An experiment the site's operator has not approved (yet)."""

    status = "not_approved"


class PolicyGuard:
    """Checks requests for one site against ``policy``. ``self_approved``: the operator is
    the one who runs the coordinator (``fed-auc simulate``, in-process): no approval asked."""

    def __init__(
        self,
        policy: NodePolicy,
        site: str,
        echo: Callable[[str], None] = print,
        self_approved: bool = False,
    ) -> None:
        self.policy = policy
        self.site = site
        self.echo = echo
        self.self_approved = self_approved
        self._digests: dict[int, str] = {}  # id(SiteData) → its digest (hashed once)
        self._approved: set[str] = set()  # experiment digests found approved

    def refuse(self, kind: str, rule: str, message: str, error: type = PolicyRefused) -> None:
        """Record, tell and raise: the coordinator sees the site and the rule."""
        record_refusal(self.policy.folder, self.site, kind, rule, message)
        self.echo(f"{self.site}: refused a {kind} request by policy rule {rule!r}: {message}")
        raise error(
            f"site {self.site}: policy rule {rule!r} ({self.policy.source}): {message}", rule
        )

    def admit(self, setup: NodeSetup, data: SiteData, run_dir: Path) -> None:
        """The run's experiment, before its node is built: the rules that a registration's
        provisional setup already settles (its run, backend, DP). Approval waits for the
        first update (``approved``): the coordinator settles the data-dependent defaults
        (network, lr, augmentation) only once the sites registered."""
        policy, kind = self.policy, "run"
        self.check_experiment(setup.run_id, kind)
        if policy.backends is not None and setup.algorithm not in policy.backends:
            self.refuse(
                kind,
                "backends",
                f"backend {setup.algorithm!r} is not one of {list(policy.backends)}",
            )
        mode = dp_mode(setup)
        if policy.dp_modes is not None and mode not in policy.dp_modes:
            self.refuse(kind, "dp_modes", f"DP mode {mode!r} is not one of {list(policy.dp_modes)}")
        self._check_privacy(setup, data, run_dir)

    def approved(self, setup: NodeSetup, kind: str) -> None:
        """Before any update leaves: the experiment is one its operator approved, else its
        summary and digest are printed and the request refused (``NotApproved``)."""
        policy = self.policy
        if not policy.require_approval or self.self_approved:
            return
        digest = experiment_digest(setup)
        if digest in self._approved or is_approved(policy, digest):
            self._approved.add(digest)
            return
        remember_pending(policy, digest, setup)
        self.echo(f"{self.site}: new experiment {digest} (run {setup.run_id}): {summary(setup)}")
        self.refuse(
            kind,
            "require_approval",
            f"experiment {digest} is not approved; its operator approves it with: "
            f"fed-auc node approve --site {policy.source} {digest}",
            NotApproved,
        )

    def check_experiment(self, run_id: str, kind: str) -> None:
        patterns = self.policy.experiments
        if patterns is not None and not any(fnmatchcase(run_id, p) for p in patterns):
            self.refuse(kind, "experiments", f"run {run_id!r} matches none of {list(patterns)}")

    def _check_privacy(self, setup: NodeSetup, data: SiteData, run_dir: Path) -> None:
        """ε and δ of the run, and of the site's data over its lifetime."""
        policy, kind = self.policy, "run"
        dp = setup.example_dp or setup.update_dp
        target = None if dp is None else dp.get("target_epsilon")
        bounded = policy.max_epsilon_per_run is not None or policy.lifetime_epsilon is not None
        if bounded and target is None:
            rule = "max_epsilon_per_run" if policy.lifetime_epsilon is None else "lifetime_epsilon"
            self.refuse(
                kind,
                rule,
                "the run has no target ε (DP off, or σ only): its spend "
                "has no bound this node can check",
            )
        if policy.max_epsilon_per_run is not None and target > policy.max_epsilon_per_run:
            self.refuse(
                kind, "max_epsilon_per_run", f"target ε {target} > {policy.max_epsilon_per_run}"
            )
        if dp is None:
            return
        delta = dp["delta"]
        if policy.max_delta is not None and delta > policy.max_delta:
            self.refuse(kind, "max_delta", f"δ {delta} > {policy.max_delta}")
        if policy.folder is None:
            return
        ledger = LifetimeLedger(policy.folder)
        digest = self.data_digest(data)
        if policy.lifetime_epsilon is not None:
            at = policy.max_delta or delta
            spent = ledger.spent(digest, at, besides=setup.run_id)
            if spent + target > policy.lifetime_epsilon:
                runs = ledger.runs(digest, besides=setup.run_id)
                self.refuse(
                    kind,
                    "lifetime_epsilon",
                    f"this data has spent ε {spent:.3g} "
                    f"(δ {at}) in run(s) {runs}; this run's target ε {target} would "
                    f"pass the lifetime ε {policy.lifetime_epsilon}",
                )
        ledger.join(digest, setup.run_id, run_dir)

    def data_digest(self, data: SiteData) -> str:
        key = id(data)
        if key not in self._digests:
            self._digests = {key: site_data_digest(data)}  # one dataset at a time
        return self._digests[key]

    def train(self, broadcast: Broadcast, setup: NodeSetup | None) -> None:
        """An update: of an approved experiment (``setup`` None: a node built by hand, no
        experiment to approve), masked where secure aggregation is required."""
        if setup is not None:
            self.approved(setup, "train")
        if self.policy.require_secure_aggregation and SECURE_CONFIG_KEY not in broadcast.config:
            self.refuse(
                "train",
                "require_secure_aggregation",
                "an update would leave unmasked (no secure aggregation session)",
            )

    def evaluate(self, data: SiteData, splits: Sequence[str], pooled: bool, kind: str) -> None:
        """What a score may reveal: the splits, the smallest group, per-image scores."""
        policy = self.policy
        for name in splits:
            if name == TRAINING_SPLIT:
                self.refuse(
                    kind,
                    "splits",
                    "the training split is never evaluated: its scores "
                    "describe the images the model was trained on",
                )
            if name not in policy.splits:
                self.refuse(kind, "splits", f"split {name!r} is not one of {list(policy.splits)}")
            split = getattr(data, name)
            if len(split) < policy.min_split_n:
                self.refuse(
                    kind,
                    "min_split_n",
                    f"split {name!r} has {len(split)} images < {policy.min_split_n}",
                )
            for positives, known in zip(split.positives(), split.known(), strict=True):
                smaller = min(positives, known - positives)
                if smaller < policy.min_split_positives:
                    self.refuse(
                        kind,
                        "min_split_positives",
                        f"split {name!r} has a label with "
                        f"{smaller} positive or negative image(s) < "
                        f"{policy.min_split_positives}",
                    )
        if pooled and not policy.pooled_scores:
            self.refuse(kind, "pooled_scores", "per-image scores may not leave this node")

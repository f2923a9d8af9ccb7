"""Approval of an experiment: the node trains only an experiment its operator approved.

An experiment is what the node is asked to compute and release, the run's ``NodeSetup``
(backend, model, loss, DP, rounds, ...) without its run id: the same experiment run again is
the same experiment (its privacy spend is the lifetime budget's business), and any changed
field is a new one with a new digest. The digest is SHA-256 over the setup's canonical JSON.
The operator approves it with ``fed-auc node approve --site FILE DIGEST`` (a file under
``<state_dir>/policy/approved/``) or ahead of time with ``approved = [DIGEST]`` in the policy.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fed_auc.node.policy.records import private_folder, read_json, write_private
from fed_auc.node.policy.rules import DIGEST, NodePolicy
from fed_auc.node.setup import NodeSetup

APPROVED_FOLDER = "approved"
PENDING_FOLDER = "pending"  # experiments met and not approved yet: what `approve` shows


def experiment(setup: NodeSetup) -> dict[str, Any]:
    """The experiment as the node sees it: every setup field but the run id."""
    values = setup.to_dict()
    values.pop("run_id")
    return values


def experiment_digest(setup: NodeSetup) -> str:
    text = json.dumps(experiment(setup), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def dp_mode(setup: NodeSetup) -> str:
    if setup.example_dp is not None:
        return "example"
    return "none" if setup.update_dp is None else "update"


def summary(setup: NodeSetup) -> str:
    """One line an operator can judge: what it trains, how long, what leaves, under which DP."""
    dp = setup.example_dp or setup.update_dp
    privacy = (
        "none"
        if dp is None
        else (
            f"{dp_mode(setup)} (clip {dp['clip']}, σ {dp.get('noise_multiplier')}, "
            f"target ε {dp.get('target_epsilon')}, δ {dp['delta']})"
        )
    )
    model = setup.model_config.get("arch", "?")
    return (
        f"backend {setup.algorithm}, model {model}, loss {setup.loss}, rounds {setup.rounds}, "
        f"batch {setup.batch_size}, image {setup.image_size}px, {setup.num_labels} label(s), "
        f"DP {privacy}; releases one model update per round"
        + (" (partial training)" if setup.partial_training else "")
        + ("" if setup.personalize is None else f", personal model {setup.personalize}")
    )


def is_approved(policy: NodePolicy, digest: str) -> bool:
    if digest in policy.approved:
        return True
    folder = policy.folder
    return folder is not None and (folder / APPROVED_FOLDER / digest).is_file()


def remember_pending(policy: NodePolicy, digest: str, setup: NodeSetup) -> None:
    """Keep the experiment met, so ``fed-auc node approve`` can show what it approves."""
    if policy.folder is not None:
        record = {
            "summary": summary(setup),
            "experiment": experiment(setup),
            "run_id": setup.run_id,
        }
        write_private(policy.folder / PENDING_FOLDER / f"{digest}.json", json.dumps(record))


def pending(policy: NodePolicy) -> list[tuple[str, dict[str, Any]]]:
    """The experiments met and not approved yet (digest, record), oldest first: what an
    operator who missed the node's console line reviews."""
    folder = None if policy.folder is None else policy.folder / PENDING_FOLDER
    if folder is None or not folder.is_dir():
        return []
    met = sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime)
    records = [(path.stem, read_json(path, None)) for path in met]
    return [(digest, r) for digest, r in records if r and not is_approved(policy, digest)]


def approve(policy: NodePolicy, digest: str) -> str | None:
    """Record the operator's approval of ``digest``; the summary of the experiment when the
    node has met it (None: approved ahead of time)."""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"{digest!r} is not an experiment digest (64 hex digits)")
    if policy.folder is None:
        raise ValueError(f"{policy.source}: the node has no state directory to record in")
    pending = read_json(policy.folder / PENDING_FOLDER / f"{digest}.json", None)
    write_private(private_folder(policy.folder / APPROVED_FOLDER) / digest, digest + "\n")
    return None if pending is None else pending["summary"]

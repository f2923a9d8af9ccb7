"""The node's policy against a coordinator that asks cleverly: each test plays the coordinator
with what it holds (the run's setup, a model, its own requests) through the Flower node path
(``NodeWorker.handle``, as ``fed-auc node`` answers) or in-process (``LocalTransport``), and
the request must be refused by name, recorded and told."""

from __future__ import annotations

import json
import stat

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.cli import main
from fed_auc.exchange import Broadcast, EvaluationRequest, NodeRefused, refusal, refused_status
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model, model_from_config
from fed_auc.node.policy.approval import experiment_digest
from fed_auc.node.policy.guard import NotApproved, PolicyRefused
from fed_auc.node.setup import NodeSetup
from fed_auc.privacy.accounting import epsilon, recorded_steps
from fed_auc.simulation import build_federation
from fed_auc.site import SiteDefinition
from fed_auc.trainable import Trainable
from fed_auc.transport.flower.codec import broadcast_frame, frame_reply, tensor_frame
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.flower_worker import SMALL, _setup, _site_toml

SITE = "mercy_rural"


def _worker(tmp_path, policy: str = "") -> tuple[NodeWorker, SiteDefinition]:
    table = f"\n[policy]\n{policy}\n" if policy else ""
    site = SiteDefinition.from_toml(_site_toml(tmp_path / "files", SITE, 2, extra=table))
    return NodeWorker(site), site


def _experiment(run_id: str = "run1", **options) -> tuple[dict, Broadcast]:
    """The setup the coordinator sends for a run with ``options``, and round 1's broadcast."""
    config = ExperimentConfig(**{**SMALL, **options})
    torch.manual_seed(config.seed)
    backend = build_backend(config.algorithm, **config.backend_hyperparameters())
    model = build_model(config.model, num_labels=1, norm=config.model_norm())
    state = backend.init_server(Trainable(model, build_loss(config.loss, 1, [0.5])), {})
    broadcast = backend.plan(state, 0, "train")
    broadcast.config["pos_ratio"] = [0.2]
    setup = config.node_setup(run_id, model.config(), num_labels=1, num_sites=SMALL["sites"])
    return setup.to_dict(), broadcast


def _dp_setup(run_id: str, target: float, **options) -> dict:
    """The setup of an example-DP run (DP-SGD)."""
    return _dp_run(run_id, target, **options)[0]


def _dp_run(run_id: str, target: float, **options) -> tuple[dict, Broadcast]:
    return _experiment(run_id, dp="example", dp_clip=1.0, target_epsilon=target, **options)


def _refusals(site: SiteDefinition) -> list[dict]:
    path = site.state_dir / "policy" / "refusals.log"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return [json.loads(line) for line in path.read_text().splitlines()]


def _report(setup: dict, splits: list[str]) -> tuple[dict, list[bytes]]:
    """An evaluation job's request for ``splits`` of the setup's model (random weights)."""
    model_config = setup["model_config"]
    tensors = model_from_config(model_config).state_dict()
    request = EvaluationRequest(
        "fed-auc-model/1", model_config, ["finding"], [0.5], "none", splits, 20, 0
    )
    header = {"kind": "report", "setup": setup, "request": request.to_dict()}
    return tensor_frame(header, tensors)


# -- the training split --------------------------------------------------------------------
def test_a_report_on_the_training_split_is_refused_without_any_policy(tmp_path):
    """The attack: an evaluation job naming splits ["train"] got n, AUC, ROC, bins and
    calibration of the DP-SGD node's training images. Refused, with no [policy] table."""
    worker, site = _worker(tmp_path)
    setup = _dp_setup("run1", 4.0)
    with pytest.raises(PolicyRefused, match="'splits'.*training split is never evaluated"):
        worker.handle(*_report(setup, ["train"]))
    assert _refusals(site)[0]["rule"] == "splits"
    report = worker.handle(*_report(setup, ["test"]))[0]["report"]  # its own splits still are
    assert list(report["splits"]) == ["test"]


def test_a_report_on_the_training_split_is_refused_in_process(tmp_path):
    path = _site_toml(tmp_path / "files", SITE, 2)
    config = ExperimentConfig(**{**SMALL, "sites": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    federation = build_federation(config)
    transport = federation.coordinator.transport
    setup = _setup()[0]
    request = EvaluationRequest.from_dict(_report(setup, ["train"])[0]["request"])
    tensors = model_from_config(setup["model_config"]).state_dict()
    failure = transport.report([SITE], request, tensors)[SITE]
    federation.store.close()
    assert failure.status == "policy"
    assert SITE in failure.message and "'splits'" in failure.message


def test_train_in_the_policys_splits_is_refused_when_the_file_is_read(tmp_path):
    with pytest.raises(ValueError, match=r"mercy_rural.toml: \[policy\] splits: 'train' is never"):
        _worker(tmp_path, 'splits = ["val", "train"]')


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("dp_modes = ['central']", r"\[policy\] dp_modes: 'central' is not one of"),
        ("max_epsilon_per_run = -1", r"\[policy\] max_epsilon_per_run = -1: must be a number"),
        ("min_split_n = 1.5", r"\[policy\] min_split_n = 1.5: must be an integer"),
        ("pooled_scores = 'no'", r"\[policy\] pooled_scores = 'no': must be true or false"),
        ("approved = ['abc']", r"\[policy\] approved: 'abc' is not an experiment digest"),
        ("epsilon = 3", r"\[policy\]: unknown key\(s\) \['epsilon'\]"),
    ],
)
def test_policy_errors_name_the_file_and_the_key(tmp_path, policy, message):
    with pytest.raises(ValueError, match=message):
        _worker(tmp_path, policy)


# -- what a run may be ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "setup", "rule"),
    [
        ("backends = ['coda_plus']\nrequire_approval = false", {}, "backends"),
        ("dp_modes = ['example']\nrequire_approval = false", {}, "dp_modes"),
        ("experiments = ['chest-*']\nrequire_approval = false", {}, "experiments"),
        ("max_epsilon_per_run = 1.0\nrequire_approval = false", {}, "max_epsilon_per_run"),
        ("max_epsilon_per_run = 1.0\nrequire_approval = false", {"dp": 2.0}, "max_epsilon_per_run"),
        ("max_delta = 1e-7\nrequire_approval = false", {"dp": 0.5}, "max_delta"),
    ],
)
def test_a_run_outside_the_policy_is_refused_at_registration(tmp_path, policy, setup, rule):
    """The Flower node path: the node is never built; the refusal names site, rule and
    file, travels with its status, and is logged privately."""
    worker, site = _worker(tmp_path, policy)
    values = _dp_setup("run1", setup["dp"]) if "dp" in setup else _setup()[0]
    with pytest.raises(PolicyRefused, match=f"site {SITE}: policy rule '{rule}'") as refused:
        worker.handle({"kind": "register", "setup": values}, [])
    assert str(site.path) in str(refused.value)
    assert refused_status(refusal(refused.value)) == "policy"  # what the coordinator reads
    assert worker.host.node is None
    assert _refusals(site)[-1]["rule"] == rule


def test_an_in_process_site_refuses_a_run_outside_its_policy_naming_itself(tmp_path):
    table = "\n[policy]\nbackends = ['coda_plus']\n"
    path = _site_toml(tmp_path / "files", SITE, 2, extra=table)
    config = ExperimentConfig(**{**SMALL, "sites": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    with pytest.raises(NodeRefused, match=f"site {SITE}: policy rule 'backends'"):
        build_federation(config)


# -- what a request may ask ----------------------------------------------------------------
def test_an_update_that_would_leave_unmasked_is_refused(tmp_path):
    worker, site = _worker(tmp_path, "require_secure_aggregation = true\nrequire_approval = false")
    setup, broadcast = _setup()
    with pytest.raises(PolicyRefused, match="'require_secure_aggregation'"):
        worker.handle(*broadcast_frame(broadcast, setup))
    assert _refusals(site)[-1]["request"] == "train"


def test_per_image_scores_and_small_groups_are_refused(tmp_path):
    policy = "pooled_scores = false\nmin_split_positives = 1000\nrequire_approval = false"
    worker, _ = _worker(tmp_path, policy)
    setup, broadcast = _setup()
    model = {k: v for k, v in broadcast.tensors.items() if not k.startswith(("ref/", "c/"))}
    header = {"kind": "evaluate", "setup": setup, "pooled": True}
    with pytest.raises(PolicyRefused, match="'min_split_positives'"):
        worker.handle(*tensor_frame(header, model))
    worker, _ = _worker(tmp_path / "b", "pooled_scores = false\nrequire_approval = false")
    with pytest.raises(PolicyRefused, match="'pooled_scores'"):
        worker.handle(*tensor_frame(header, model))
    header["pooled"] = False
    assert worker.handle(*tensor_frame(header, model))[0]["splits"]


def test_a_small_split_is_never_reported_on(tmp_path):
    worker, _ = _worker(tmp_path, "min_split_n = 100000")
    with pytest.raises(PolicyRefused, match="'min_split_n'.*split 'test' has"):
        worker.handle(*_report(_setup()[0], ["test"]))


# -- approval ------------------------------------------------------------------------------
def test_a_node_trains_only_an_experiment_its_operator_approved(tmp_path, capsys):
    """The node registers (counts only), then prints the experiment and its digest and
    refuses every update until `fed-auc node approve`; a changed experiment (one more round)
    is a new one."""
    worker, site = _worker(tmp_path, "max_delta = 1e-5")
    setup, broadcast = _setup()
    digest = experiment_digest(NodeSetup.from_dict(setup))
    worker.handle({"kind": "register", "setup": setup}, [])
    with pytest.raises(NotApproved, match=f"fed-auc node approve --site {site.path} {digest}"):
        worker.handle(*broadcast_frame(broadcast, setup))
    with pytest.raises(NotApproved):  # nor a secure aggregation step
        worker.handle({"kind": "secure", "setup": setup, "step": "keys", "message": {}}, [])
    assert refused_status(refusal(NotApproved("x", "require_approval"))) == "not_approved"
    capsys.readouterr()
    assert main(["node", "approve", "--site", str(site.path)]) == 0  # what waits, for review
    waiting = capsys.readouterr().out
    assert f"{digest}  run {setup['run_id']}: backend" in waiting and "1 experiment(s)" in waiting
    assert main(["node", "approve", "--site", str(site.path), digest]) == 0
    shown = capsys.readouterr().out
    assert f"approved experiment {digest}: backend" in shown and "rounds 2" in shown
    main(["node", "approve", "--site", str(site.path)])
    assert "0 experiment(s) wait" in capsys.readouterr().out  # approved: no longer pending
    assert frame_reply(worker.handle(*broadcast_frame(broadcast, setup))).steps > 0  # no restart
    approved = site.state_dir / "policy" / "approved" / digest
    assert stat.S_IMODE(approved.stat().st_mode) == 0o600
    changed = {**setup, "rounds": 3, "run_id": "run2"}
    with pytest.raises(NotApproved, match=experiment_digest(NodeSetup.from_dict(changed))):
        NodeWorker(site).handle(*broadcast_frame(broadcast, changed))
    assert [r["rule"] for r in _refusals(site)] == ["require_approval"] * 3


def test_an_experiment_approved_ahead_of_time_trains_at_once(tmp_path):
    setup, broadcast = _setup()
    digest = experiment_digest(NodeSetup.from_dict(setup))
    worker, _ = _worker(tmp_path, f"approved = ['{digest}']")
    assert frame_reply(worker.handle(*broadcast_frame(broadcast, setup))).steps > 0


def test_simulate_approves_its_own_in_process_experiment(tmp_path):
    """In-process, the one who runs ``fed-auc simulate`` is every site's operator."""
    path = _site_toml(tmp_path / "files", SITE, 2, extra="\n[policy]\nrequire_approval = true\n")
    config = ExperimentConfig(**{**SMALL, "sites": 1, "rounds": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    federation = build_federation(config)
    transport = federation.coordinator.transport
    reply = transport.train({SITE: _setup()[1]})[SITE]
    federation.store.close()
    assert reply.steps > 0


# -- the lifetime budget -------------------------------------------------------------------
def test_a_second_run_on_the_same_images_starts_from_the_first_runs_spend(tmp_path):
    """Run 1 spends ε on the site's images; run 2 (another run id) would fit the lifetime ε
    from zero, but not after run 1: refused, naming what was spent and where."""
    policy = "lifetime_epsilon = 3.0\nrequire_approval = false"
    worker, site = _worker(tmp_path, policy)
    first, broadcast = _dp_run("run1", 2.0)
    worker.handle({"kind": "register", "setup": first}, [])
    frame_reply(worker.handle(*broadcast_frame(broadcast, first)))
    spent = epsilon(recorded_steps(site.state_dir / "run1"), 1e-5)
    assert spent > 0
    second = _dp_setup("run2", round(3.0 - spent / 2, 6))  # fits from zero, not after run 1
    with pytest.raises(
        PolicyRefused, match=r"'lifetime_epsilon'.*spent ε .* in run\(s\) \['run1'\]"
    ):
        NodeWorker(site).handle({"kind": "register", "setup": second}, [])
    lifetime = site.state_dir / "policy" / "lifetime.json"
    assert stat.S_IMODE(lifetime.stat().st_mode) == 0o600
    fresh, _ = _worker(tmp_path / "other", policy)  # a node with nothing spent: from zero
    fresh.handle({"kind": "register", "setup": second}, [])


def test_simulate_spends_from_the_same_lifetime_budget(tmp_path):
    """In-process too: a second `fed-auc simulate` run on the same site file starts from the
    first run's spend."""
    table = "\n[policy]\nlifetime_epsilon = 3.0\n"
    path = _site_toml(tmp_path / "files", SITE, 2, extra=table)
    options = {**SMALL, "sites": 1, "rounds": 1, "dp": "example", "dp_clip": 1.0,
               "target_epsilon": 2.0, "site_files": [str(path)]}  # fmt: skip
    first = build_federation(ExperimentConfig(**options, runs_dir=str(tmp_path / "a")))
    first.coordinator.transport.train({SITE: _dp_run("x", 2.0, rounds=1)[1]})
    first.store.close()
    with pytest.raises(PolicyRefused, match=f"site {SITE}: policy rule 'lifetime_epsilon'"):
        build_federation(ExperimentConfig(**options, runs_dir=str(tmp_path / "b")))


def test_a_node_never_contacts_a_coordinator_its_policy_does_not_name(tmp_path, capsys):
    """`fed-auc node --coordinator` with an address outside `[policy] coordinators` stops
    before the node locks its state, loads its data or starts a SuperNode, naming the rule."""
    _, site = _worker(tmp_path, 'coordinators = ["fl.north.example:9092"]')
    with pytest.raises(SystemExit, match=r"\[policy\] coordinators: evil.example:9092 is not one"):
        main(["node", "--site", str(site.path), "--coordinator", "evil.example:9092", "--insecure"])
    assert not (site.state_dir / "supernode.log").exists()
    assert not (site.state_dir / "node.lock").exists()  # the state directory was never locked

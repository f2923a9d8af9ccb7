"""A node compares two models on its own test split (``fed_auc.node.compare``): through the
Flower node path (``NodeWorker.handle``, as ``fed-auc node`` answers) it returns exactly what
``paired_auc_differences`` gives on the same test images, nothing per image; identical models
differ by zero with a zero-width interval; and a comparison passes the node's policy as an
evaluation of each model would (the coordinator asking for the training split is refused)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from fed_auc.exchange import ComparisonRequest, EvaluationRequest
from fed_auc.metrics.paired import paired_auc_differences
from fed_auc.models import model_from_config
from fed_auc.node.policy.guard import PolicyRefused
from fed_auc.node.setup import NodeSetup
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.codec import pair_tensors, tensor_frame
from fed_auc.transport.flower.worker import NodeWorker
from fed_auc.tta import predict
from tests.support.flower_worker import _setup, _site_toml

SITE = "county_general"  # 22 test images, 8 positive: a DeLong interval


def _worker(tmp_path, policy: str = "") -> NodeWorker:
    table = f"\n[policy]\n{policy}\n" if policy else ""
    return NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path, SITE, 2, extra=table)))


def _model(config: dict, seed: int):
    torch.manual_seed(seed)
    return model_from_config(config).eval()


def _request(config: dict, splits: list[str], tta: str) -> EvaluationRequest:
    return EvaluationRequest("fed-auc-model/1", config, ["finding"], [0.5], tta, splits, 0, 0)


def _frame(setup: dict, models, splits=("test",), kind="compare", tta=("none", "flip")):
    """The coordinator's comparison of ``models`` (A, B) on ``splits``, as one frame."""
    config = setup["model_config"]
    request = ComparisonRequest(*(_request(config, list(splits), t) for t in tta))
    header = {"kind": kind, "setup": setup, "request": request.to_dict()}
    return tensor_frame(header, pair_tensors(tuple(m.state_dict() for m in models)))


def test_a_node_returns_exactly_the_paired_differences_of_its_test_images(tmp_path):
    worker = _worker(tmp_path)
    setup = _setup()[0]
    config = setup["model_config"]
    a, b = _model(config, 1), _model(config, 2)
    answer = worker.handle(*_frame(setup, (a, b)))[0]["comparison"]
    test = worker._site_data(NodeSetup.from_dict(setup)).test  # the node's own images
    want = paired_auc_differences(
        test.labels.numpy(), predict(a, test.images, "none"), predict(b, test.images, "flip")
    )  # each with its own TTA
    assert answer["site"] == SITE and list(answer["splits"]) == ["test"]
    (row,) = answer["splits"]["test"]
    assert row == {"label": "finding", **asdict(want[0])}
    assert row["n"] == len(test.labels) and row["difference"] != 0.0
    assert set(answer) == {"site", "splits", "duration_s"}  # nothing per image


def test_identical_models_differ_by_zero_with_a_zero_width_interval(tmp_path):
    worker = _worker(tmp_path)
    setup = _setup()[0]
    model = _model(setup["model_config"], 1)
    answer = worker.handle(*_frame(setup, (model, model), tta=("none", "none")))[0]
    (row,) = answer["comparison"]["splits"]["test"]
    assert row["auc_a"] == row["auc_b"] and row["difference"] == 0.0
    assert row["lo"] == row["hi"] == 0.0 and row["se"] == 0.0 and row["p_value"] == 1.0


def _refusal(worker: NodeWorker, frame) -> str:
    with pytest.raises(PolicyRefused) as refused:
        worker.handle(*frame)
    return str(refused.value)


@pytest.mark.parametrize(
    ("policy", "splits", "rule"),
    [("", ["train"], "'splits'.*training split is never evaluated"),
     ('splits = ["val"]', ["test"], "'splits'.*split 'test' is not one of \\['val'\\]"),
     ("min_split_n = 100000", ["test"], "'min_split_n'")],
)  # fmt: skip
def test_a_comparison_the_policy_refuses_for_evaluation_is_refused_with_the_same_reason(
    tmp_path, policy, splits, rule
):
    """The coordinator asks a node to compare two models on a split its policy will not
    evaluate (the training split, whose scores describe the images the model trained on):
    refused by the same rule, in the same words, as an evaluation job of either model."""
    setup = _setup()[0]
    config = setup["model_config"]
    models = (_model(config, 1), _model(config, 2))
    worker = _worker(tmp_path, policy)
    compared = _refusal(worker, _frame(setup, models, splits))
    report = {"kind": "report", "setup": setup,
              "request": _request(config, splits, "none").to_dict()}  # fmt: skip
    reported = _refusal(worker, tensor_frame(report, models[0].state_dict()))
    assert compared == reported and SITE in compared
    with pytest.raises(PolicyRefused, match=rule):
        worker.handle(*_frame(setup, models, splits))
    logged = (worker.site.state_dir / "policy" / "refusals.log").read_text()
    assert '"compare"' in logged  # the operator's log says what was asked


def test_two_models_on_different_labels_or_splits_are_no_pair(tmp_path):
    worker = _worker(tmp_path)
    setup = _setup()[0]
    config = setup["model_config"]
    models = [_model(config, 1).state_dict()] * 2
    b = EvaluationRequest("fed-auc-model/1", config, ["other"], [0.5], "none", ["test"], 0, 0)
    request = ComparisonRequest(_request(config, ["test"], "none"), b)
    header = {"kind": "compare", "setup": setup, "request": request.to_dict()}
    with pytest.raises(ValueError, match="different labels"):
        worker.handle(*tensor_frame(header, pair_tensors(tuple(models))))

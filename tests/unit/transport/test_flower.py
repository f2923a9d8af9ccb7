"""Flower transport: payload codec, node worker, certificates, config; real runs on loopback."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from fed_auc.exchange import Broadcast, Evaluation, Reply, SplitEvaluation
from fed_auc.experiment.config import SIMULATED_FEDERATION, ExperimentConfig
from fed_auc.experiment.files import load_experiment
from fed_auc.io import load_state
from fed_auc.metrics.auc import AUCResult
from fed_auc.node.build import build_node
from fed_auc.node.setup import NodeSetup
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.certs import make_certs
from fed_auc.transport.flower.codec import (
    PER_TENSOR_ENV,
    TensorCache,
    broadcast_frame,
    decode_tensors,
    digest,
    encode_tensors,
    evaluation_frame,
    frame_broadcast,
    frame_evaluation,
    frame_reply,
    frame_tensors,
    reply_frame,
    tensor_frame,
)
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.flower_worker import SMALL, _setup, _site_toml

SITES = ["st_elsewhere", "county_general", "mercy_rural"]


# -- codec ----------------------------------------------------------------------------------
def test_tensors_travel_as_one_buffer_per_dtype_and_come_back_exactly():
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(3, 4, generator=gen),
        "steps": torch.tensor(7),
        "b": torch.randn(5, generator=gen),
        "count": torch.arange(6).view(2, 3),
    }
    index, buffers = encode_tensors(tensors)
    assert len(buffers) == 2  # float32 and int64
    assert sum(len(b) for b in buffers) == (12 + 5) * 4 + (1 + 6) * 8
    back = decode_tensors(index, buffers)
    assert list(back) == list(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    with pytest.raises(ValueError, match="payload buffer 0 holds 16 float32 values"):
        decode_tensors(index, [buffers[0][:-4], buffers[1]])


def test_the_naive_baseline_sends_one_buffer_per_tensor_and_decodes_the_same(monkeypatch):
    tensors = {"w": torch.randn(3, 4), "b": torch.randn(5), "n": torch.arange(3)}
    monkeypatch.setenv(PER_TENSOR_ENV, "1")
    index, buffers = encode_tensors(tensors)
    assert [len(b) for b in buffers] == [48, 20, 24]
    back = decode_tensors(index, buffers)
    assert all(torch.equal(back[name], tensor) for name, tensor in tensors.items())


def test_the_sites_of_one_request_share_its_buffers_and_flower_arrays(monkeypatch):
    """One model to three sites: one copy of its bytes and one Flower Array (hashed and
    chunked once), unless a site holds part of it; the naive baseline shares nothing."""
    from fed_auc.transport.flower.client import frame_content, message_frame

    model = {"w": torch.randn(3, 4), "b": torch.randn(5), "n": torch.arange(3)}
    memo, shared = {}, {}
    frames = [tensor_frame({"kind": "evaluate"}, model, [], memo) for _ in range(2)]
    held = tensor_frame({"kind": "evaluate"}, model, [digest(model["b"])], memo)
    assert all(a is b for a, b in zip(frames[0][1], frames[1][1], strict=True))
    assert held[1][0] is not frames[0][1][0] and len(held[1][0]) == 12 * 4
    contents = [frame_content(h, b, shared) for h, b in [*frames, held]]
    arrays = [content["buffers"]["b0"] for content in contents]
    assert arrays[0] is arrays[1] and arrays[2] is not arrays[0]
    for content in contents[:2]:
        back = frame_tensors(message_frame(content))
        assert all(torch.equal(back[name], t) for name, t in model.items())
    monkeypatch.setenv(PER_TENSOR_ENV, "1")
    memo = {}
    naive = [tensor_frame({}, model, [], memo)[1] for _ in range(2)]
    assert all(a is not b and a == b for a, b in zip(*naive, strict=True))


def test_requests_and_replies_round_trip_through_frames():
    broadcast = Broadcast(3, "train", {"w": torch.ones(2, 2)}, {"lr": 0.1, "pos_ratio": [0.2]})
    frame = broadcast_frame(broadcast, {"run_id": "r"})
    json.dumps(frame[0])  # the header is plain JSON
    back = frame_broadcast(frame)
    assert (back.round, back.phase, back.config) == (3, "train", broadcast.config)
    assert torch.equal(back.tensors["w"], broadcast.tensors["w"])

    reply = Reply({"w": torch.full((2,), 0.5)}, steps=4, metrics={"train_loss": 0.25})
    reply.num_examples, reply.site = 40, "a"
    again = frame_reply(reply_frame(reply))
    assert (again.steps, again.metrics, again.num_examples, again.site) == (
        4,
        reply.metrics,
        40,
        "a",
    )

    scores = np.array([[0.1], [0.9]], dtype=np.float32)
    labels = np.array([[0.0], [1.0]], dtype=np.float32)
    auc = AUCResult(1.0, 0.5, 1.0, 2, 1)
    pooled = Evaluation("a", {"test": SplitEvaluation(2, [1], [auc], scores, labels)}, 0.1)
    private = Evaluation("a", {"test": SplitEvaluation(2, [1], [auc])}, 0.1)
    got = frame_evaluation(evaluation_frame(pooled)).splits["test"]
    assert got.aucs == [auc] and np.array_equal(got.scores, scores)
    assert np.array_equal(got.labels, labels)
    header, buffers = evaluation_frame(private)
    assert buffers == [] and frame_evaluation((header, buffers)).splits["test"].scores is None


def test_tensors_the_receiver_holds_travel_as_tags_and_come_back_exactly():
    gen = torch.Generator().manual_seed(1)
    model = {"w": torch.randn(4, 3, generator=gen), "n": torch.arange(3)}
    ref = {"ref/w": torch.randn(4, 3, generator=gen)}
    cache = TensorCache()
    first = encode_tensors({**model, **ref}, known=cache.tags())
    assert sum(len(b) for b in first[1]) == (12 + 12) * 4 + 3 * 8  # nothing known yet
    decode_tensors(*first, cache)
    # the next request: a new model, the same reference; only the new model's bytes travel
    new_model = {"w": model["w"] + 1, "n": model["n"]}
    index, buffers = encode_tensors({**new_model, **ref}, known=cache.tags())
    assert sum(len(b) for b in buffers) == 12 * 4
    back = decode_tensors(index, buffers, cache)
    for name, tensor in {**new_model, **ref}.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    back["ref/w"].add_(1.0)  # a node that changes what it got does not change the cache
    again = decode_tensors(*encode_tensors(ref, known=cache.tags()), cache)
    assert torch.equal(again["ref/w"], ref["ref/w"])


def test_the_cache_keeps_two_requests_and_a_missing_tag_is_a_clear_error():
    a, b, c = torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)
    cache = TensorCache()
    for tensors in ({"x": a}, {"x": b}, {"x": c}):
        decode_tensors(*encode_tensors(tensors, known=[]), cache)
    assert cache.tags() == sorted({digest(b), digest(c)})  # a, two requests ago, is gone
    assert digest(a) != digest(torch.zeros(2, 1))  # the shape is part of the tag
    index, buffers = encode_tensors({"x": a}, known=[digest(a)])
    with pytest.raises(ValueError, match=f"tensor 'x' was sent as cached copy {digest(a)}"):
        decode_tensors(index, buffers, cache)


def test_the_naive_baseline_never_sends_tags(monkeypatch):
    tensors = {"w": torch.randn(3)}
    monkeypatch.setenv(PER_TENSOR_ENV, "1")
    index, buffers = encode_tensors(tensors, known=[digest(tensors["w"])])
    assert [len(b) for b in buffers] == [12] and len(index[0]) == 4


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"index": -1}, "[node] index = -1: must be an integer ≥ 0"),
        ({"index": True}, "[node] index = True: must be an integer ≥ 0"),
        ({"index": None}, "[node] index is required for [synthetic] (it seeds the images)"),
        ({"speed": 3}, "unknown [node] key(s) ['speed']"),
        ({"data": "synthetic"}, "[node] data moved: use a [data] table with spec = ..."),
        ({"local_steps": 0}, "[node] local_steps = 0: must be an integer ≥ 1"),
        ({"threads": 1.5}, "[node] threads = 1.5: must be an integer ≥ 1"),
        ({"memory_budget": "lots"}, "[node] memory_budget: 'lots' is not a size"),
        ({"memory_budget": "6 parsecs"}, "[node] memory_budget: '6 parsecs' is not a size"),
        ({"memory_budget": 0}, "[node] memory_budget: must be a fraction in (0, 1] or bytes"),
        ({"memory_budget": -0.5}, "[node] memory_budget: must be a fraction in (0, 1] or bytes"),
        ({"augment": "rotate"}, "[node] augment = 'rotate': must be one of"),
        ({"tta": "rotate"}, "[node] tta = 'rotate': must be one of"),
        ({"state_dir": 3}, "[node] state_dir = 3: must be a path string"),
        ({"extra": '[data]\nspec = "medmnist:x.npz"\n'}, "give exactly one of [synthetic]"),
        ({"extra": 'color = "blue"\n'}, "unknown [node] key(s) ['color']"),
        ({"extra": '[hospital]\nbeds = 3\n'}, "unknown top-level key(s) ['hospital']"),
        ({"extra": "[node\n"}, "invalid TOML"),
    ],
)  # fmt: skip
def test_site_config_errors_name_the_file_and_field(tmp_path, node, message):
    node = dict(node)
    index = node.pop("index", 2)
    path = _site_toml(tmp_path, "mercy_rural", index, node.pop("extra", ""), **node)
    with pytest.raises(ValueError, match="mercy_rural.toml") as error:
        SiteDefinition.from_toml(path)
    assert message in str(error.value)


def test_a_site_file_without_synthetic_or_data_is_refused(tmp_path):
    path = tmp_path / "bare.toml"
    path.write_text('name = "bare"\n[node]\nindex = 0\n')
    with pytest.raises(ValueError, match=r"bare.toml: give exactly one of \[synthetic\]"):
        SiteDefinition.from_toml(path)
    path.write_text('name = "bare"\n[data]\nspec = "medmnist:x.npz"\n[node]\nindex = "zero"\n')
    with pytest.raises(ValueError, match="bare.toml: \\[node\\] index = 'zero'"):
        SiteDefinition.from_toml(path)


def test_a_good_site_file_gives_its_node_settings_with_paths_from_its_folder(tmp_path):
    path = _site_toml(
        tmp_path, "county_general", 1, state_dir="state/here", local_steps=3,
        memory_budget="6GiB", augment="flip", tta="none",
    )  # fmt: skip
    site = SiteDefinition.from_toml(path)
    assert (site.name, site.index, site.synthetic, site.order) == (
        "county_general", 1, True, (1, "county_general"),
    )  # fmt: skip
    assert site.state_dir == (tmp_path / "state" / "here").resolve()
    assert (site.local_steps, site.threads, site.augment, site.tta) == (3, 1, "flip", "none")
    assert site.budget() == "6GiB" and site.seed_index == 1


def test_worker_keeps_local_state_across_a_restart(tmp_path):
    """Two rounds with a restart in between end where two rounds without one end."""
    setup, broadcast = _setup()
    path = _site_toml(tmp_path / "a", "county_general", 1, memory_budget="4GiB")
    steady = NodeWorker(SiteDefinition.from_toml(path))
    header, _ = steady.handle({"kind": "register", "setup": setup}, [])
    assert header["site"] == "county_general"
    assert header["registration"]["order"] == [1, "county_general"]
    assert header["registration"]["synthetic"] is True
    assert header["registration"]["memory_budget"] == "4GiB"  # reported; unused here
    assert header["summary"]["train"]["n"] == header["registration"]["n"]
    for _ in range(2):
        expected = frame_reply(steady.handle(*broadcast_frame(broadcast, setup)))

    site = SiteDefinition.from_toml(_site_toml(tmp_path / "b", "county_general", 1, local_steps=2))
    frame_reply(NodeWorker(site).handle(*broadcast_frame(broadcast, setup)))
    again = frame_reply(NodeWorker(site).handle(*broadcast_frame(broadcast, setup)))
    assert again.steps == expected.steps == 2
    for name, tensor in expected.tensors.items():
        torch.testing.assert_close(again.tensors[name], tensor)
    a = load_state(tmp_path / "a" / "nodes" / "county_general" / "run1" / "local_state.pt")
    b = load_state(site.state_dir / "run1" / "local_state.pt")
    torch.testing.assert_close(b["sampler"], a["sampler"])


def test_a_worker_fed_tags_answers_as_one_fed_every_byte(tmp_path):
    """Train, evaluate, train again with what the node holds sent as tags: same replies."""
    setup, broadcast = _setup()
    replies = []
    for name, tagged in (("full", False), ("tagged", True)):
        worker = NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path / name, "mercy_rural", 2)))
        held = worker.handle({"kind": "register", "setup": setup}, [])[0]["cached"]
        assert held == []
        first = worker.handle(*broadcast_frame(broadcast, setup, held if tagged else None))
        model = {n: t for n, t in broadcast.tensors.items() if not n.startswith(("ref/", "c/"))}
        request = {"kind": "evaluate", "setup": setup, "pooled": False}
        known = first[0]["cached"] if tagged else None
        held = worker.handle(*tensor_frame(request, model, known))[0]["cached"]
        second = dataclasses.replace(broadcast, round=1)
        frame = broadcast_frame(second, setup, held if tagged else None)
        if tagged:  # the node holds all of round 1's tensors: only the header travels
            assert frame[1] == [] and set(held) >= {entry[4] for entry in frame[0]["index"]}
        replies.append([frame_reply(first), frame_reply(worker.handle(*frame))])
    for full, tagged in zip(*replies, strict=True):
        for name, tensor in full.tensors.items():
            assert torch.equal(tagged.tensors[name], tensor), name


def test_site_local_steps_override_the_coordinators(tmp_path):
    setup, broadcast = _setup()
    site = SiteDefinition.from_toml(_site_toml(tmp_path, "mercy_rural", 2, local_steps=3))
    assert frame_reply(NodeWorker(site).handle(*broadcast_frame(broadcast, setup))).steps == 3


def test_worker_refuses_a_request_older_than_one_it_answered(tmp_path):
    """A late ClientApp for round 1 must not overwrite round 2's pending state."""
    setup, broadcast = _setup()
    worker = NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path, "mercy_rural", 2)))
    later = dataclasses.replace(broadcast, round=1)
    assert frame_reply(worker.handle(*broadcast_frame(later, setup))).round == 1
    pending = tmp_path / "nodes" / "mercy_rural" / "run1" / "local_state.pending.pt"
    with pytest.raises(ValueError, match="stale request for round 1"):
        worker.handle(*broadcast_frame(broadcast, setup))
    assert load_state(pending)["tag"] == [1, 0]


def test_worker_reports_a_bad_request_kind(tmp_path):
    setup, _ = _setup()
    worker = NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path, "mercy_rural", 2)))
    with pytest.raises(ValueError, match="unknown request kind 'fit'"):
        worker.handle({"kind": "fit", "setup": setup}, [])


# -- certificates and config ------------------------------------------------------------------
def test_certs_make_a_ca_that_signed_the_server_and_p384_site_keys(tmp_path):
    from flwr.cli.supernode.register import try_load_public_key

    out = make_certs(tmp_path / "certs", ["a", "b"], hosts=["coord.example"])
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "coord.example" in names.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    key = load_ssh_private_key((out / "keys" / "a.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert try_load_public_key(out / "keys" / "b.pub")
    assert (out / "keys" / "a.key").stat().st_mode & 0o077 == 0


def test_experiment_config_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('algorithm = "codasca"\n')
    with pytest.raises(SystemExit, match="exp.toml: missing \\[flower\\] table"):
        load_experiment(path, {})
    path.write_text('algorithm = "codasca"\n[flower]\nmin_node = 2\ninsecure = true\n')
    with pytest.raises(SystemExit, match=r"unknown \[flower\] key\(s\) \['min_node'\]"):
        load_experiment(path, {})
    path.write_text("rounds = 2\n[flower]\nmin_nodes = 0\ninsecure = true\n")
    with pytest.raises(SystemExit, match="min_nodes must be an integer ≥ 1, got 0"):
        load_experiment(path, {})
    path.write_text("rounds = 2\ncolour = 1\n[flower]\ninsecure = true\n")
    with pytest.raises(SystemExit, match=r"exp.toml: unknown key\(s\) \['colour'\]"):
        load_experiment(path, {})
    path.write_text("rounds = 2\ntransport = 'local'\n[flower]\ninsecure = true\n")
    with pytest.raises(SystemExit, match=r"unknown key\(s\) \['transport'\]"):
        load_experiment(path, {})
    path.write_text("rounds = 2\n[flower]\nexpected_sites = 2\nmin_nodes = 3\ninsecure = true\n")
    with pytest.raises(SystemExit, match=r"min_nodes \(3\) cannot exceed expected_sites \(2\)"):
        load_experiment(path, {})
    path.write_text("rounds = 2\n[flower]\ncerts_dir = 'certs'\nexpected_sites = 3\n")
    experiment = load_experiment(path, {"rounds": 5, "address": "0.0.0.0:9999"})
    assert experiment["experiment"]["rounds"] == 5
    assert experiment["experiment"]["transport"] == "flower"
    assert experiment["flower"]["certs_dir"] == str(tmp_path / "certs")
    assert experiment["flower"]["expected_sites"] == 3
    assert experiment["flower"]["address"] == "0.0.0.0:9999"


SIMULATED_LINES = {
    "sites": "sites = 3",
    "data": "data = 'medmnist:x.npz'",
    "partition": "partition = 'iid'",
    "data_scale": "data_scale = 0.5",
    "feature_shift": "feature_shift = 0.1",
    "uncertain": "uncertain = 'ones'",
    "frontal_only": "frontal_only = true",
    "skip_bad_images": "skip_bad_images = true",
    "site_memory": "site_memory = [0.5, 1.0]",
    "site_local_steps": "site_local_steps = [2, 3]",
    "site_files": "site_files = ['a.toml']",
    "positive_label": "positive_label = 0",
    "aspect": "aspect = 'crop'",
    "positive_class": "positive_class = 'malignant'",
    "classes": "classes = 9",
}


def test_every_simulated_federation_option_has_a_refusal_case():
    assert set(SIMULATED_LINES) == set(SIMULATED_FEDERATION)


@pytest.mark.parametrize("key", sorted(SIMULATED_LINES))
def test_options_the_flower_nodes_cannot_honour_are_refused(tmp_path, key):
    """Options that describe a simulated federation are refused by name: each node owns its
    data (its site file), and expected_sites says how many to wait for."""
    path = tmp_path / "exp.toml"
    path.write_text(f"rounds = 2\n{SIMULATED_LINES[key]}\n[flower]\ninsecure = true\n")
    with pytest.raises(SystemExit, match="exp.toml") as error:
        load_experiment(path, {})
    message = str(error.value)
    assert f"['{key}'] describe a simulated federation" in message
    assert "expected_sites" in message


def test_options_a_flower_node_honours_itself_are_accepted(tmp_path):
    """Personalization, partial training and the warm-up now run over Flower as well."""
    path = tmp_path / "exp.toml"
    path.write_text(
        "rounds = 2\npersonalize = 'l2'\npartial_training = true\nwarmup_rounds = 2\n"
        "[flower]\ninsecure = true\nexpected_sites = 2\n"
    )
    experiment = load_experiment(path, {})["experiment"]
    assert (experiment["personalize"], experiment["partial_training"]) == ("l2", True)
    assert experiment["warmup_rounds"] == 2
    config = ExperimentConfig(**experiment)  # what the coordinator rebuilds: still valid
    assert config.transport == "flower" and config.data_is_synthetic() is None


def test_the_supernode_entry_caps_flowers_idle_sleeps():
    """Flower's SuperNode sleeps 3 s between empty pulls and 0.5 s between looks for a reply
    (or a chunk of it); our entry point caps both."""
    import inspect
    import time

    from flwr.supernode import start_client_internal

    from fed_auc.transport.flower import supernode as flower_supernode

    assert "time.sleep(3)" in inspect.getsource(start_client_internal)  # what the cap is for
    assert start_client_internal.time.monotonic is time.monotonic  # the rest is the real module
    start = time.perf_counter()
    start_client_internal.time.sleep(3)
    assert time.perf_counter() - start < flower_supernode.POLL_S + 0.5
    # its waits for a reply, and for each chunk of it, look into its own memory: 5 ms, not 0.5 s
    assert inspect.getsource(start_client_internal).count("time.sleep(0.5)") == 2
    start = time.perf_counter()
    for _ in range(10):
        start_client_internal.time.sleep(0.5)
    assert time.perf_counter() - start < 10 * flower_supernode.LOCAL_POLL_S + 0.5


def test_flower_object_pulls_retry_within_a_quarter_second():
    """Flower retries a pull of a not-yet-pushed object after 1, 2, 4 … s; ours after tenths."""
    import time

    from flwr.supercore import constant
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError, pull_objects

    from fed_auc.transport.flower import backoff as flower_backoff

    assert constant.PULL_INITIAL_BACKOFF >= 1  # what the shortening is for
    flower_backoff.shorten()
    tries = []

    def arrives_on_the_fourth_try(object_id: str) -> bytes:
        tries.append(time.perf_counter())
        if len(tries) < 4:
            raise ObjectUnavailableError(object_id)
        return b"chunk"

    start = time.perf_counter()
    assert pull_objects(["x"], arrives_on_the_fourth_try) == {"x": b"chunk"}
    assert time.perf_counter() - start < 3 * flower_backoff.CAP_S + 0.5  # Flower's own: ~7 s
    tries_allowed = flower_backoff.PULLERS[0].__kwdefaults__["max_tries_per_object"]
    assert tries_allowed * flower_backoff.CAP_S >= constant.PULL_MAX_TIME  # as patient as before
    flower_backoff.shorten(flower_backoff.LOCAL_CAP_S)  # a node's executor: its own SuperNode
    try:
        defaults = flower_backoff.PULLERS[1].__kwdefaults__
        assert defaults["backoff_cap"] == flower_backoff.LOCAL_CAP_S
        assert defaults["max_tries_per_object"] * defaults["backoff_cap"] >= constant.PULL_MAX_TIME
    finally:
        flower_backoff.shorten()


def test_a_flower_node_samples_with_the_experiments_batch_floors(tmp_path):
    setup, _ = _setup()
    setup = {**setup, "min_pos_fraction": 0.1, "min_neg_fraction": 0.25}
    worker = NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path, "county_general", 1)))
    worker.handle({"kind": "register", "setup": setup}, [])
    site = worker.site
    node = build_node(
        NodeSetup.from_dict(setup), site.load(28, 1, 0, SMALL["data_scale"]), site.hosting(),
        tmp_path / "direct",
    )  # fmt: skip
    floors = (math.ceil(0.1 * setup["batch_size"]), math.ceil(0.25 * setup["batch_size"]))
    for built in (worker.host.node, node):  # the worker's node is build_node's
        assert (built.batches.min_positives, built.batches.min_negatives) == floors


def test_a_node_trains_within_its_memory_budget_only_under_partial_training(tmp_path):
    """The site's memory budget (its file's) chooses what it trains when the experiment has
    partial training; otherwise the node trains the whole model."""
    from fed_auc.models import group_names

    setup, _ = _setup()
    site = SiteDefinition.from_toml(_site_toml(tmp_path, "county_general", 1, memory_budget=0.15))
    data = site.load(28, 1, 0, SMALL["data_scale"])
    full = build_node(NodeSetup.from_dict(setup), data, site.hosting(), tmp_path / "f")
    partial = build_node(
        NodeSetup.from_dict({**setup, "partial_training": True}), data, site.hosting(),
        tmp_path / "p",
    )  # fmt: skip
    assert full.registration()["trained_groups"] is None  # the whole model
    trained = partial.registration()["trained_groups"]
    order = group_names(partial.trainable.model)
    assert 0 < len(trained) < len(order) and trained == order[-len(trained) :]

"""Flower transport: payload codec, node worker, certificates, config; real runs on loopback."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from fed_auc.algorithms.base import Broadcast, Reply
from fed_auc.experiment import ExperimentConfig
from fed_auc.io import load_state
from fed_auc.metrics import AUCResult
from fed_auc.node import Evaluation, SplitEvaluation
from fed_auc.transport.flower.certs import make_certs
from fed_auc.transport.flower.cli import load_experiment
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
    reply_frame,
    tensor_frame,
)
from fed_auc.transport.flower.worker import NodeWorker, SiteConfig, build_node

HOSPITALS = Path(__file__).resolve().parents[1] / "hospitals"
SITES = ["st_elsewhere", "county_general", "mercy_rural"]
SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


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


# -- node worker ----------------------------------------------------------------------------
def _site_toml(tmp_path: Path, site: str, index: int, **node) -> Path:
    text = (HOSPITALS / f"{site}.toml").read_text().split("\n[node]")[0]
    table = {"index": index, "state_dir": str(tmp_path / "nodes" / site), "threads": 1, **node}
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{site}.toml"
    path.write_text(text + "\n[node]\n" + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"index": -1}, "index = -1: must be an integer ≥ 0"),
        ({"speed": 3}, "unknown [node] key(s) ['speed']"),
        ({"data": "pacs"}, "data = 'pacs': only 'synthetic'"),
        ({"local_steps": 0}, "local_steps = 0: must be an integer ≥ 1"),
    ],
)
def test_site_config_errors_name_the_file_and_field(tmp_path, node, message):
    node = dict(node)
    path = _site_toml(tmp_path, "mercy_rural", node.pop("index", 2), **node)
    with pytest.raises(ValueError, match="mercy_rural.toml") as error:
        SiteConfig.from_toml(path)
    assert message in str(error.value)


def _setup(run_id: str = "run1") -> tuple[dict, Broadcast]:
    from fed_auc.algorithms import build_backend
    from fed_auc.losses import build_loss
    from fed_auc.models import build_model
    from fed_auc.trainable import Trainable
    from fed_auc.transport.flower.server import node_setup

    config = ExperimentConfig(**SMALL)
    torch.manual_seed(config.seed)
    backend = build_backend(config.algorithm, **config.backend_hyperparameters())
    model = build_model(config.model, num_labels=1)
    state = backend.init_server(Trainable(model, build_loss(config.loss, 1, [0.5])), {})
    broadcast = backend.plan(state, 0, "train")
    broadcast.config["pos_ratio"] = [0.2]
    setup = node_setup(config, run_id, model.config())
    return setup, broadcast


def test_worker_keeps_local_state_across_a_restart(tmp_path):
    """Two rounds with a restart in between end where two rounds without one end."""
    setup, broadcast = _setup()
    steady = NodeWorker(SiteConfig.from_toml(_site_toml(tmp_path / "a", "county_general", 1)))
    header, _ = steady.handle({"kind": "register", "setup": setup}, [])
    assert header["site"] == "county_general" and header["registration"]["index"] == 1
    assert header["summary"]["train"]["n"] == header["registration"]["n"]
    for _ in range(2):
        expected = frame_reply(steady.handle(*broadcast_frame(broadcast, setup)))

    site = SiteConfig.from_toml(_site_toml(tmp_path / "b", "county_general", 1, local_steps=2))
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
        worker = NodeWorker(SiteConfig.from_toml(_site_toml(tmp_path / name, "mercy_rural", 2)))
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
    site = SiteConfig.from_toml(_site_toml(tmp_path, "mercy_rural", 2, local_steps=3))
    assert frame_reply(NodeWorker(site).handle(*broadcast_frame(broadcast, setup))).steps == 3


def test_worker_refuses_a_request_older_than_one_it_answered(tmp_path):
    """A late ClientApp for round 1 must not overwrite round 2's pending state."""
    setup, broadcast = _setup()
    worker = NodeWorker(SiteConfig.from_toml(_site_toml(tmp_path, "mercy_rural", 2)))
    later = dataclasses.replace(broadcast, round=1)
    assert frame_reply(worker.handle(*broadcast_frame(later, setup))).round == 1
    pending = tmp_path / "nodes" / "mercy_rural" / "run1" / "local_state.pending.pt"
    with pytest.raises(ValueError, match="stale request for round 1"):
        worker.handle(*broadcast_frame(broadcast, setup))
    assert load_state(pending)["tag"] == [1, 0]


def test_worker_reports_a_bad_request_kind(tmp_path):
    setup, _ = _setup()
    worker = NodeWorker(SiteConfig.from_toml(_site_toml(tmp_path, "mercy_rural", 2)))
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
    path.write_text("rounds = 2\n[flower]\ncerts_dir = 'certs'\n")
    experiment = load_experiment(path, {"rounds": 5})
    assert experiment["simulation"]["rounds"] == 5
    assert experiment["flower"]["certs_dir"] == str(tmp_path / "certs")


@pytest.mark.parametrize(
    ("line", "named"),
    [("personalize = 'l2'", "personalize"), ("partial_training = true", "partial_training"),
     ("data = 'medmnist:x.npz'", "data = 'medmnist:x.npz'")],
)  # fmt: skip
def test_options_the_flower_nodes_cannot_honour_are_refused(tmp_path, line, named):
    path = tmp_path / "exp.toml"
    path.write_text(f"rounds = 2\n{line}\n[flower]\ninsecure = true\n")
    with pytest.raises(SystemExit, match=f"{named}.*not supported over Flower yet"):
        load_experiment(path, {})


def test_the_supernode_entry_caps_flowers_idle_sleeps():
    """Flower's SuperNode sleeps 3 s between empty pulls; our entry point caps that."""
    import inspect
    import time

    from flwr.supernode import start_client_internal

    from fed_auc.transport.flower import supernode as flower_supernode

    assert "time.sleep(3)" in inspect.getsource(start_client_internal)  # what the cap is for
    assert start_client_internal.time.monotonic is time.monotonic  # the rest is the real module
    start = time.perf_counter()
    start_client_internal.time.sleep(3)
    assert time.perf_counter() - start < flower_supernode.POLL_S + 0.5


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


def test_a_flower_node_samples_with_the_experiments_batch_floors(tmp_path):
    setup, _ = _setup()
    setup = {**setup, "min_pos_fraction": 0.1, "min_neg_fraction": 0.25}
    node = build_node(SiteConfig.from_toml(_site_toml(tmp_path, "county_general", 1)), setup)
    assert (node.batches.min_positives, node.batches.min_negatives) == (
        math.ceil(0.1 * setup["batch_size"]), math.ceil(0.25 * setup["batch_size"]),
    )  # fmt: skip

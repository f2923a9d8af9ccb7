"""``--compress``: what travels is smaller, decodes to what was meant (unbiased for int8), and
a whole federation runs with it for every backend, with DP, and over Flower's codec."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.claims.saddle_fidelity import SETTINGS, run_toy
from fed_auc.algorithms import ALGORITHMS
from fed_auc.exchange import Broadcast, Reply, payload_bytes
from fed_auc.exchange.compression import (
    COMPRESS_KEY,
    SCALE,
    compress_broadcast,
    compress_reply,
    decode,
    encode,
    generator_for,
    received_broadcast,
)
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import build_model
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.codec import decode_tensors, encode_tensors


def test_int8_is_unbiased_and_off_by_less_than_one_step():
    torch.manual_seed(0)
    x = {"w/conv": torch.randn(4, 3, 3, 3), "auc/a": torch.tensor([0.37])}
    draws = 2000
    total = torch.zeros_like(x["w/conv"])
    for k in range(draws):
        wire = encode(x, "int8", generator=generator_for("test", k))
        back = decode(wire, "int8", x)
        step = wire["w/conv" + SCALE][:, None, None, None]
        assert (
            wire["w/conv"].dtype == torch.int8
            and (back["w/conv"] - x["w/conv"]).abs().le(step + 1e-7).all()
        )
        assert torch.allclose(back["auc/a"], x["auc/a"])  # a scalar is its own scale: exact
        total += back["w/conv"]
    step = float(x["w/conv"].abs().amax() / 127)
    # the mean of n stochastic roundings: each error has |e| ≤ step, so sd ≤ step / (2 √n)
    assert float((total / draws - x["w/conv"]).abs().max()) < 5 * step / (2 * draws**0.5)


def test_an_update_travels_as_its_difference_from_the_broadcast():
    start = {"w/x": torch.full((3, 1000), 100.0)}  # a large weight...
    reply = {"w/x": start["w/x"] + 1e-3}  # ...and a small update: fp16 of the value loses it
    for mode in ("fp16", "int8"):
        wire = encode(reply, mode, start, generator_for("t"))
        back = decode(wire, mode, reply, start)["w/x"]
        assert torch.allclose(back - 100.0, torch.full((3, 1000), 1e-3), rtol=1e-3), mode
    assert not torch.equal(reply["w/x"].half().float(), reply["w/x"])


def test_densenet121_travels_in_at_most_half_and_a_quarter_of_the_bytes():
    model = build_model("densenet121")
    tensors = {f"w/{n}": t.detach() for n, t in model.state_dict().items()}
    plain = payload_bytes(tensors)
    start = {n: t + 0.01 for n, t in tensors.items() if t.is_floating_point()}
    fp16 = payload_bytes(encode(tensors, "fp16", start))
    int8 = payload_bytes(encode(tensors, "int8", start, generator_for("t")))
    assert plain / fp16 >= 1.9 and plain / int8 >= 3.5, (plain / fp16, plain / int8)


def test_a_compressed_request_and_reply_cross_flowers_codec_as_their_bytes():
    broadcast = Broadcast(
        2, "train", {"w/x": torch.randn(5, 7), "b/n": torch.tensor(3)}, {"lr": 0.1}
    )
    wire = compress_broadcast(broadcast, "int8")
    index, buffers = encode_tensors(wire.tensors)
    assert sum(len(b) for b in buffers) == payload_bytes(wire.tensors) == 5 * 7 + 5 * 4 + 8
    moved = decode_tensors(index, buffers)
    assert all(
        torch.equal(moved[n], t) and moved[n].dtype == t.dtype for n, t in wire.tensors.items()
    )
    received = received_broadcast(dataclasses.replace(wire, tensors=moved))
    assert (
        received.tensors["w/x"].dtype == torch.float32 and received.config[COMPRESS_KEY] == "int8"
    )
    assert torch.equal(received.tensors["b/n"], torch.tensor(3))  # integers travel as they are
    reply = Reply({"w/x": received.tensors["w/x"] - 0.01}, steps=1, site="a", round=2)
    sent, seen = compress_reply(reply, received)
    again, _ = compress_reply(reply, received)  # a reply computed again is the same bytes
    assert all(torch.equal(sent.tensors[n], again.tensors[n]) for n in sent.tensors)
    assert torch.allclose(seen.tensors["w/x"], reply.tensors["w/x"], atol=0.01 / 127 + 1e-6)


def test_codasca_with_compressed_rounds_still_ends_at_the_saddle_point():
    """The control variates stay consistent (the node keeps the c^k the coordinator derives
    from what it decoded): CODASCA still ends at the saddle point. int8's stochastic rounding
    is unbiased; fp16 rounds the broadcast to nearest, a bias of fp16's resolution."""
    setting = SETTINGS["codasca"]  # 200 rounds: the plain run is there to 1e-15
    for mode, tolerance in (("int8", 1e-6), ("fp16", 2e-4)):
        distance = run_toy("codasca", "plain", (), 200, 1.0, compress=mode, **setting["hyper"])
        assert distance < tolerance, (mode, distance)


SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


def _bytes(runs, summary) -> tuple[int, int]:
    with RunStore(runs) as store:
        rounds = store.rounds(summary["run_id"])
    return int(rounds["bytes_up"].sum()), int(rounds["bytes_down"].sum())


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_backend_trains_with_int8_in_fewer_bytes(tmp_path, algorithm):
    sizes = {}
    for mode in ("none", "int8"):
        runs = tmp_path / mode
        config = ExperimentConfig(runs_dir=str(runs), algorithm=algorithm, compress=mode, **SMALL)
        summary = run_simulation(config)
        assert all(0 <= auc <= 1 for auc in summary["global_auc"])
        sizes[mode] = _bytes(runs, summary)
    (up, down), (up8, down8) = sizes["none"], sizes["int8"]
    assert up / up8 >= 3.3 and down / down8 >= 3.3, (sizes, algorithm)  # the tiny model's rows


def test_update_dp_then_int8_spends_the_same_epsilon(tmp_path):
    dp = {"dp": "update", "dp_clip": 1.0, "dp_noise": 1.0}
    epsilons = {}
    for mode in ("none", "int8"):
        runs = tmp_path / mode
        summary = run_simulation(ExperimentConfig(runs_dir=str(runs), compress=mode, **SMALL, **dp))
        with RunStore(runs) as store:
            rows = store.site_rounds(summary["run_id"])
        epsilons[mode] = rows[rows["round"] > 0]["dp_epsilon"].tolist()
    assert epsilons["none"] == epsilons["int8"] and all(e > 0 for e in epsilons["none"])


def test_compression_with_secure_aggregation_is_refused_by_name():
    with pytest.raises(ValueError, match="compress int8 and secure_aggregation cannot be combined"):
        ExperimentConfig(compress="int8", secure_aggregation=True, sites=3).validate()
    with pytest.raises(ValueError, match="compress"):
        ExperimentConfig(compress="int4").validate()


def test_a_coordinators_malformed_request_is_refused_by_the_node_by_name():
    """A coordinator (hostile or broken) that sends a scale the node cannot use gets a named
    refusal, never a model trained from it; empty tensors round-trip."""
    x = {"w/x": torch.randn(3, 4), "w/empty": torch.zeros(0), "w/rows": torch.zeros(0, 3)}
    wire = compress_broadcast(Broadcast(0, "train", x, {}), "int8")
    assert received_broadcast(wire).tensors["w/empty"].shape == (0,)
    wire.tensors["w/x" + SCALE] = torch.tensor([1.0, float("inf"), 1.0])
    with pytest.raises(ValueError, match=r"round 1 train request: 'w/x#scale' holds a negative"):
        received_broadcast(wire)
    wire.tensors["w/x" + SCALE] = torch.ones(2)
    with pytest.raises(ValueError, match=r"'w/x' needs 'w/x#scale' of 3 float32 values"):
        received_broadcast(wire)
    with pytest.raises(ValueError, match="compress = 'int4'"):
        received_broadcast(dataclasses.replace(wire, config={COMPRESS_KEY: "int4"}))

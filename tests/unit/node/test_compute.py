"""Devices and precision (fed_auc.node.compute): what the operator asks for or a clear error,
reduced precision inside the local step only, and a reply that does not depend on either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.data.synthetic import make_synthetic_federation
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model, group_names
from fed_auc.node.compute import Compute, LossScale, resolve_device
from fed_auc.node.node import LocalTraining, Node
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable

CPU = torch.device("cpu")
SITE = """name = "north"

[synthetic]
n_train = 60
n_val = 30
n_test = 30
prevalence = [0.3]

[node]
index = 0
"""


def test_auto_is_the_cpu_without_cuda_and_cuda_without_it_is_an_error_naming_both():
    assert not torch.cuda.is_available()  # this suite runs on CPU machines
    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU
    for asked in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"device = '{asked}' asked for, but torch .*"):
            resolve_device(asked)
    with pytest.raises(ValueError, match="no CUDA|no usable GPU"):
        resolve_device("cuda")
    for bad in ("gpu", "cuda:x", "cuda:01", "CPU", 3):
        with pytest.raises(ValueError, match="must be auto, cpu, cuda or cuda:N"):
            resolve_device(bad)


def test_cuda_asked_of_each_kind_of_torch_says_the_remedy_that_fits_it(monkeypatch):
    """A CPU-only build: install the CUDA build. A CUDA build that sees no GPU: installing is
    no cure; the GPU must be made visible to it."""
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ValueError, match=r"CPU-only build .*install a CUDA build of torch"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as refused:
        resolve_device("cuda")
    assert "(CUDA 12.8) finds no usable GPU" in str(refused.value)
    assert "none is visible to it: check `nvidia-smi`" in str(refused.value)
    assert "install" not in str(refused.value)


def test_a_cuda_index_beyond_the_devices_found_names_how_many_there_are(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"'cuda:2' asked for, but 2 CUDA device\(s\): cuda:0 to"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match="choose one of those devices, or auto"):
        resolve_device("cuda:2")


def test_the_commands_refuse_a_cuda_device_this_machine_lacks(tmp_path, capsys):
    from fed_auc.cli import main

    site = tmp_path / "north.toml"
    site.write_text(SITE + 'device = "cuda:0"\n')
    with pytest.raises(SystemExit, match=rf"fed-auc node: {site}: device = 'cuda:0' asked for"):
        main(["node", "--site", str(site), "--check"])
    with pytest.raises(SystemExit, match=r"device = 'cuda' asked for, but"):  # the flag wins
        main(["node", "--site", str(site), "--check", "--device", "cpu", "--device", "cuda"])
    assert main(["node", "--site", str(site), "--check", "--device", "cpu"]) == 0
    assert "computes on cpu in fp32" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="device = 'cuda' asked for, but"):
        main(["simulate", "--rounds", "1", "--device", "cuda", "--runs-dir", str(tmp_path)])


def test_a_site_file_device_is_checked_with_its_name_and_a_coordinator_never_sets_one(tmp_path):
    site = tmp_path / "north.toml"
    site.write_text(SITE + 'device = "gpu0"\n')
    with pytest.raises(ValueError, match=rf"{site}: \[node\] device = 'gpu0': must be"):
        SiteDefinition.from_toml(site)
    site.write_text(SITE + 'precision = "fp8"\n')
    with pytest.raises(ValueError, match=rf"{site}: \[node\] precision = 'fp8': must be one of"):
        SiteDefinition.from_toml(site)
    with pytest.raises(ValueError, match="over Flower each node's operator chooses them"):
        ExperimentConfig(transport="flower", device="cpu")


def make_node(state_dir: Path, precision: str = "fp32") -> tuple[Node, dict]:
    site = make_synthetic_federation(num_sites=1, seed=3, scale=0.3)[0]
    backend = build_backend("codasca", local_steps=3, seed=0)
    torch.manual_seed(0)
    model = build_model("tiny")
    server = Trainable(model, build_loss("auc_margin", 1, [0.5]))
    state = backend.init_server(server, {site.name: len(site.train)})
    training = LocalTraining(model.config(), "auc_margin")
    node = Node(site, backend, training, state_dir, compute=Compute.of("auto", precision))
    return node, state


def train_once(node: Node, state: dict):
    broadcast = node.backend.plan({**state, "round": 0}, 0)
    broadcast.config.update(pos_ratio=[0.3])
    return node.train(broadcast)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_trains_on_cpu_and_everything_that_travels_stays_fp32(
    tmp_path, precision
):
    full, state = make_node(tmp_path / "fp32")
    reduced, _ = make_node(tmp_path / precision, precision)
    want, got = train_once(full, state), train_once(reduced, state)
    layout = {n: (t.dtype, t.shape, t.device) for n, t in want.tensors.items()}
    assert {n: (t.dtype, t.shape, t.device) for n, t in got.tensors.items()} == layout
    assert all(t.dtype == torch.float32 for t in got.tensors.values() if t.is_floating_point())
    for name in ("auc/a", "auc/b", "auc/alpha"):
        assert got.tensors[name].dtype == torch.float32
        assert reduced.trainable._tensor(name).dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in got.tensors.values())
    weights = [n for n in want.tensors if n.startswith("w/")]
    moved = [not torch.equal(got.tensors[n], state["model"][n]) for n in weights]
    assert any(moved)  # it trained
    # the network really ran in reduced precision: the same steps, other rounding
    assert any(not torch.equal(got.tensors[n], want.tensors[n]) for n in weights)
    saved = reduced._local_state["control"]
    assert all(t.dtype == torch.float32 and t.device == CPU for t in saved.values())
    assert reduced.registration()["precision"] == precision
    assert reduced.registration()["device"] == "cpu"
    assert got.metrics["images_per_s"] > 0 and got.metrics["host_peak_mib"] > 0
    assert "device_peak_mib" not in got.metrics  # CUDA only


def test_the_fp16_loss_scale_backs_off_until_the_gradients_are_finite():
    w = torch.tensor([3.0], requires_grad=True)
    scale = LossScale(CPU)
    value = (w * 1e36).sum()  # × 65536 overflows fp32: the scale must come down
    (grad,) = scale.gradients(value, [w])
    assert grad.dtype == torch.float32 and torch.equal(grad, torch.tensor([1e36]))
    assert scale.scaler.get_scale() < 65536.0


def test_a_trainables_named_buffers_follow_the_model_to_another_device():
    model = build_model("tiny")
    trainable = Trainable(model, build_loss("auc_margin", 1, [0.5]))
    trainable.train_only(group_names(model)[-2:])  # a frozen input side, too
    trainable.to(torch.device("meta"))  # moves every tensor, as CUDA would
    current = {f"buf/{n}": b for n, b in model.named_buffers()}
    current.update({f"w/{n}": p for n, p in model.named_parameters()})
    views = {**trainable.buffers, **trainable._frozen, **trainable.primal}
    assert views and all(t.device.type == "meta" for t in views.values())
    assert all(t is current[n] for n, t in views.items() if n in current)


def tiny_run(runs_dir: Path, device: str) -> tuple[dict, str]:
    config = ExperimentConfig(
        rounds=2, sites=2, local_steps=2, seed=5, device=device, runs_dir=str(runs_dir)
    )
    summary = run_simulation(config)
    return torch.load(summary["model_path"], weights_only=True), summary["run_id"]


def test_the_same_seed_gives_the_same_model_on_cpu_and_auto_and_records_the_compute(tmp_path):
    cpu, _ = tiny_run(tmp_path / "cpu", "cpu")
    auto, run_id = tiny_run(tmp_path / "auto", "auto")
    for part in ("state_dict", "auc"):
        torch.testing.assert_close(auto[part], cpu[part], rtol=0, atol=0)
    with RunStore(tmp_path / "auto") as store:
        rows = store.site_rounds(run_id)
    trained = rows[rows["status"] == "completed"]
    computes = [json.loads(m)["compute"] for m in trained["metrics"]]
    assert len(computes) == 4
    assert all(c["device"] == "cpu" and c["precision"] == "fp32" for c in computes)
    assert all(c["images_per_s"] > 0 and c["host_peak_mib"] > 0 for c in computes)
    card = json.loads((tmp_path / "auto" / run_id / "model" / "model_card.json").read_text())
    assert set(card["compute"]) == set(trained["site"])
    assert all(c["device"] == "cpu" for c in card["compute"].values())


def test_fp16_with_dp_sgd_is_refused_by_name(tmp_path):
    from fed_auc.privacy.dp_sgd import ExampleDP
    from tests.support.dp import tiny_site

    model = build_model("tiny", norm="group")
    with pytest.raises(ValueError, match="'hospital_a': precision fp16 with dp = 'example'"):
        Node(
            tiny_site(), build_backend("codasca", local_steps=1),
            LocalTraining(model.config(), "auc_margin", batch_size=4), tmp_path,
            privacy=ExampleDP(clip=1.0, noise_multiplier=1.0), compute=Compute.of("cpu", "fp16"),
        )  # fmt: skip


def test_a_federated_evaluation_leaves_the_device_to_each_node(tmp_path):
    from fed_auc.cli import main

    with pytest.raises(SystemExit, match="each node scores on its own device"):
        main(["evaluate", "--model", str(tmp_path), "--out", str(tmp_path / "out"),
              "--federation", str(tmp_path / "exp.toml"), "--device", "cpu"])  # fmt: skip


def test_the_same_round_in_another_precision_is_another_dp_release(tmp_path):
    from fed_auc.exchange import Broadcast
    from fed_auc.privacy.dp_sgd import ExampleDP
    from tests.support.dp import tiny_site

    def node(precision: str) -> Node:  # the same state directory: a restarted node
        dp = ExampleDP(clip=1.0, target_epsilon=8.0, rounds=4, local_steps=2)
        model = build_model("tiny", norm="group")
        return Node(
            tiny_site(), build_backend("local_sgda", local_steps=2),
            LocalTraining(model.config(), "auc_margin", batch_size=8), tmp_path,
            privacy=dp, compute=Compute.of("cpu", precision),
        )  # fmt: skip

    config = {"pos_ratio": [0.25], "lr": 0.1, "local_steps": 2, "commit": None, "continue": None}
    fp32 = node("fp32")
    tensors = fp32.trainable.tensors()
    first = fp32.train(Broadcast(0, "train", tensors, config))
    again = node("fp32").train(Broadcast(0, "train", tensors, config))
    assert again.metrics["dp_epsilon"] == first.metrics["dp_epsilon"]  # the same release
    other = node("bf16").train(Broadcast(0, "train", tensors, config))
    assert other.metrics["dp_epsilon"] > first.metrics["dp_epsilon"]  # other numbers: counted


def test_a_node_reads_images_into_pinned_memory_only_for_a_cuda_device():
    """Pinned host memory speeds copies to a GPU and only costs on the CPU."""
    assert Compute(torch.device("cuda", 0)).pins_memory
    assert not Compute(torch.device("cpu"), "bf16").pins_memory

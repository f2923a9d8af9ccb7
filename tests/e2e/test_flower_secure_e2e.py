"""Secure aggregation over Flower: three hospitals' `fed-auc node`s, CODASCA, and a coordinator
that sees only sums. The run must equal `fed-auc simulate --secure-aggregation` on the same
site files (the same protocol code runs either way; Flower only carries its messages): the
exported model and the rows the store keeps, protocol bytes included, no per-site signals.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.privacy.secure.checks import LEDGER_FILE as SESSIONS_FILE
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.processes import free_port
from tests.support.data_files import write_npz
from tests.support.flower_files import _coordinator, _fed_auc, _site_file, _store, _summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT = {
    "algorithm": "codasca",
    "rounds": 2,
    "local_steps": 2,
    "batch_size": 8,
    "select": "last",
    "secure_aggregation": True,
}
COLUMNS = ["round", "steps", "n", "auc", "val_auc", "bytes_up", "bytes_down"]


@pytest.mark.parametrize("compress", ["none", "fp16"])
def test_secure_aggregation_over_flower_equals_simulate_on_the_same_site_files(tmp_path, compress):
    """``fp16``: the masked vectors are 32-bit words (``--compress fp16``), over Flower too."""
    experiment = {**EXPERIMENT, "compress": compress}
    files = []
    for k, name in enumerate(("north", "south", "east")):
        (tmp_path / name).mkdir()
        write_npz(tmp_path / name / "site.npz", n=(40, 12, 16), seed=k)
        files.append(_site_file(tmp_path, name, f"medmnist:{name}/site.npz"))
    port = free_port()
    nodes = [
        _fed_auc(tmp_path, f"{f.stem}.log", "node", "--site", str(f), "--insecure",
                 "--coordinator", f"127.0.0.1:{port}")
        for f in files
    ]  # fmt: skip
    try:
        summary = _summary(tmp_path, "flower", _coordinator(tmp_path, port, "flower", experiment))
    finally:
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(timeout=60)
    config = ExperimentConfig(
        **experiment, site_files=[str(f) for f in files], runs_dir=str(tmp_path / "sim")
    )
    expected = run_simulation(config)

    model = load_torch(Path(summary["model_path"]))
    for name, tensor in load_torch(Path(expected["model_path"]))["state_dict"].items():
        torch.testing.assert_close(model["state_dict"][name], tensor, atol=1e-5, rtol=1e-5)
    got, _, events = _store(tmp_path / "flower", summary["run_id"])
    want, _, _ = _store(tmp_path / "sim", expected["run_id"])
    assert got[["site", "status"]].values.tolist() == want[["site", "status"]].values.tolist()
    assert got[COLUMNS].to_numpy(float) == pytest.approx(
        want[COLUMNS].to_numpy(float), abs=1e-5, nan_ok=True
    )
    trained = got[got["round"] > 0]
    assert (trained["status"] == "completed").all()
    assert trained[["update_norm", "drift", "cosine", "cv_drift"]].isna().all().all()
    for row in trained["metrics"].map(json.loads):
        assert row["secure_aggregation_bytes"]["train"]["up"] > 0
    if compress == "fp16":  # CODASCA masks its iterates and Δc^k: two words per model value,
        # 8 bytes each in 64-bit words, 4 in fp16's 32-bit ones (protocol bytes on top)
        model_values = sum(t.numel() for t in model["state_dict"].values())
        assert (trained["bytes_up"] < 2 * 4 * model_values).all()
    with RunStore(tmp_path / "flower") as store:
        assert store.run(summary["run_id"])["config"]["secure_aggregation"] is True
    assert not events["level"].eq("error").any()
    for name in ("north", "south", "east"):  # each node kept the rounds it masked, privately
        ledger = tmp_path / "state" / name / summary["run_id"] / SESSIONS_FILE
        assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
        masked = json.loads(ledger.read_text())["masked"]
        assert {key.split(":")[0] for key in masked} == {"0", "1"}
        assert all(session.startswith(f"{summary['run_id']}:") for session in masked.values())

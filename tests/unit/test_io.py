"""Atomic, packed state files: what is saved comes back exactly; a failed write keeps the old."""

from __future__ import annotations

import pytest
import torch

from fed_auc.io import load_state, pack, save_state, unpack


def test_packed_state_round_trips_exactly(tmp_path):
    state = {
        "round": 3,
        "stage": None,
        "model": {"w/a": torch.randn(3, 4), "w/b": torch.randn(5), "auc/alpha": torch.zeros(1)},
        "sampler": {"generator": torch.ByteTensor([1, 2, 3]), "queue": torch.arange(4)},
        "mixed": {"x": torch.ones(2), "y": torch.arange(2)},
    }
    packed = pack(state)
    assert set(packed["model"]) == {"__packed_tensors__", "names", "shapes", "flat"}
    assert packed["mixed"]["x"] is state["mixed"]["x"]  # mixed dtypes are left as they are
    save_state(state, tmp_path / "state.pt")
    loaded = load_state(tmp_path / "state.pt")
    assert loaded["round"] == 3 and loaded["stage"] is None
    for group in ("model", "sampler", "mixed"):
        assert list(loaded[group]) == list(state[group])
        for name, tensor in state[group].items():
            assert torch.equal(loaded[group][name], tensor) and loaded[group][name].dtype == (
                tensor.dtype
            )
    assert unpack(pack({})) == {}


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    save_state({"v": torch.ones(2)}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_state({"v": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert torch.equal(load_state(path)["v"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]

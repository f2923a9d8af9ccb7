"""A node worker's site file and first broadcast, without a SuperLink."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fed_auc.exchange import Broadcast
from fed_auc.experiment.config import ExperimentConfig
from tests.support.paths import ROOT

HOSPITALS = ROOT / "hospitals"


SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


# -- node worker ----------------------------------------------------------------------------
def _site_toml(tmp_path: Path, site: str, index: int | None, extra: str = "", **node) -> Path:
    """A demo hospital's site file with its own [node] table (``index`` None: no index)."""
    text = (HOSPITALS / f"{site}.toml").read_text().split("\n[node]")[0]
    table = {"index": index, "state_dir": str(tmp_path / "nodes" / site), "threads": 1, **node}
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{site}.toml"
    path.write_text(text + "\n[node]\n" + "\n".join(lines) + "\n" + extra)
    return path


def _setup(run_id: str = "run1") -> tuple[dict, Broadcast]:
    from fed_auc.algorithms import build_backend
    from fed_auc.losses import build_loss
    from fed_auc.models import build_model
    from fed_auc.trainable import Trainable

    config = ExperimentConfig(**SMALL)
    torch.manual_seed(config.seed)
    backend = build_backend(config.algorithm, **config.backend_hyperparameters())
    model = build_model(config.model, num_labels=1)
    state = backend.init_server(Trainable(model, build_loss(config.loss, 1, [0.5])), {})
    broadcast = backend.plan(state, 0, "train")
    broadcast.config["pos_ratio"] = [0.2]
    setup = config.node_setup(run_id, model.config(), num_labels=1, num_sites=SMALL["sites"])
    return setup.to_dict(), broadcast

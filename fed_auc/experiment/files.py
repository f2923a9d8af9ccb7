"""Experiment files: an experiment TOML with its ``[flower]`` table (``FlowerSettings``) read once,
validated before anything starts; the recorded config of a run to resume.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_auc.experiment.config import ExperimentConfig


@dataclass
class FlowerSettings:
    """The ``[flower]`` table of an experiment config."""

    address: str = "127.0.0.1:9092"  # SuperLink host:port (Fleet, Control and Runtime APIs)
    expected_sites: int = 1  # n: the sites the coordinator waits for at the start
    min_nodes: int = 1  # k: fewest sites to start and to complete a round with
    register_timeout_s: float = 300.0  # how long to wait for the expected sites at the start
    round_timeout_s: float = 600.0  # deadline of a training phase
    eval_timeout_s: float = 300.0  # deadline of an evaluation
    pooled_scoring: bool = False  # per-image scores leave the sites only if this is on
    certs_dir: str | None = None  # from `fed-auc certs`: TLS and the registered site keys
    insecure: bool = False  # no TLS, no node keys: loopback experiments only

    def __post_init__(self) -> None:
        for name in ("expected_sites", "min_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"[flower] {name} must be an integer ≥ 1, got {value!r}")
        if self.min_nodes > self.expected_sites:
            raise ValueError(
                f"[flower] min_nodes ({self.min_nodes}) cannot exceed expected_sites "
                f"({self.expected_sites})"
            )
        host, sep, port = str(self.address).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"[flower] address must be HOST:PORT, got {self.address!r}")
        for name in ("register_timeout_s", "round_timeout_s", "eval_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"[flower] {name} must be a number > 0, got {value!r}")
        if not self.insecure and self.certs_dir is None:
            raise ValueError("[flower] needs certs_dir (from `fed-auc certs`) or insecure = true")


def recorded_config(recorded: dict[str, Any], runs_dir: str | Path) -> ExperimentConfig:
    """The config a run was recorded with; options added to fed-auc since then take the value
    that reproduces how it trained (a run recorded before the negative floor had none)."""
    recorded = dict(recorded)
    # What the run recorded about its data (fed_auc.data.cards.data_record) describes what it
    # ran on, not options: the sites' data, their number and site files come from the nodes
    # over Flower, from the site files in-process.
    recorded.pop("site_data", None)
    recorded.pop("site_keys", None)  # which key each site joined with (transport.flower.identity)
    if recorded.get("transport") == "flower":
        for key in ("data", "sites", "site_files"):
            recorded.pop(key, None)
    elif recorded.get("site_files"):
        recorded.pop("data", None)
    return ExperimentConfig(**{"min_neg_fraction": 0.0, **recorded, "runs_dir": str(runs_dir)})


def read_experiment_file(path: Path, command: str) -> dict[str, Any]:
    """An experiment TOML as written (``fed-auc simulate --config`` and ``fed-auc coordinator
    --config`` both read it here). A relative ``init`` is relative to the file, as
    ``certs_dir`` is, so a config and its weights can move together."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"fed-auc {command}: cannot read config {path}: {exc}") from None
    if isinstance(data.get("init"), str):
        data["init"] = str((path.parent / data["init"]).resolve())
    return data


def load_experiment(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The experiment options plus a ``[flower]`` table, validated before anything starts."""
    from fed_auc.experiment.config import SIMULATED_FEDERATION

    data = read_experiment_file(path, "coordinator")
    flower = data.pop("flower", None)
    if not isinstance(flower, dict):
        raise SystemExit(f"fed-auc coordinator: config {path}: missing [flower] table")
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"transport"}
    flower_fields = {f.name for f in dataclasses.fields(FlowerSettings)}
    for table, keys, valid in (("", data, fields), ("[flower] ", flower, flower_fields)):
        unknown = sorted(set(keys) - valid)
        if unknown:
            raise SystemExit(
                f"fed-auc coordinator: config {path}: unknown {table}key(s) {unknown}; "
                f"valid: {sorted(valid)}"
            )
    simulated = sorted(set(data) & set(SIMULATED_FEDERATION))
    if simulated:
        raise SystemExit(
            f"fed-auc coordinator: config {path}: {simulated} describe a simulated federation; "
            "over Flower each node owns its data (its site file, `fed-auc node --site`): "
            "remove them (the number of sites to wait for is [flower] expected_sites)"
        )
    data.update({k: v for k, v in overrides.items() if k in fields and v is not None})
    flower.update({k: v for k, v in overrides.items() if k in flower_fields and v is not None})
    if flower.get("certs_dir") is not None:  # relative to the config file
        flower["certs_dir"] = str((path.parent / flower["certs_dir"]).resolve())
    try:
        config = ExperimentConfig(**data, transport="flower").resolve_files()
        settings = FlowerSettings(**flower)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"fed-auc coordinator: config {path}: {exc}") from None
    config.runs_dir = str(Path(config.runs_dir).resolve())
    return {"experiment": config.to_dict(), "flower": dataclasses.asdict(settings)}


def load_resumed(runs_dir: Path, run_id: str) -> dict[str, Any]:
    """The recorded experiment of an interrupted Flower run, to continue it."""
    from fed_auc.store.run_store import run_to_resume

    try:
        run = run_to_resume(runs_dir, run_id, "fed-auc coordinator")
    except ValueError as exc:
        raise SystemExit(f"fed-auc coordinator --resume: {exc}") from None
    record = dict(run["config"])
    if record.get("transport") != "flower":
        raise SystemExit(
            f"fed-auc coordinator --resume: run {run_id!r} did not run over Flower; "
            "continue it with `fed-auc simulate --resume`"
        )
    flower = record.pop("flower")
    config = recorded_config(record, runs_dir.resolve())
    return {"experiment": config.to_dict(), "flower": flower, "run_id": run_id, "resume": True}

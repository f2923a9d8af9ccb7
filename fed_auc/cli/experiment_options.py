"""``fed-auc simulate``'s command line: every option's flag (``cli.option_flags``), and how they
become an ``ExperimentConfig`` (defaults, then ``--config`` TOML, then the flags given)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from fed_auc.cli.option_flags import add_grouped_option_flags, add_option_flags, given_options
from fed_auc.experiment.config import ExperimentConfig


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    """Every option's flag (from its declaration), the config file, and the command's own."""
    p = sub.add_parser("simulate", help="run a federation on this machine (in-process nodes)")
    p.add_argument("--config", type=Path, help="TOML file whose keys are these options")
    p.add_argument("--sites-dir", type=Path, help="every *.toml site file of this folder")
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted run from its last recorded round (its recorded options)",
    )
    p.add_argument(
        "--leave-each-out",
        action="store_true",
        help="one training per site without it, plus one with all: each site's held-out AUC "
        "beside its in-federation AUC",
    )
    p.add_argument("--register", metavar="NAME", help="also copy the model to MODELS_DIR/NAME")
    p.add_argument("--models-dir", default="models", help="model registry folder (models)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    add_grouped_option_flags(p)


def add_compute_arguments(p: argparse.ArgumentParser, who: str) -> None:
    """``--device`` and ``--precision`` for a command whose own compute they set."""
    add_option_flags(
        p,
        ("device", "precision"),
        helps={"device": f"where to compute ({who}): auto (CUDA when usable), cpu, cuda or "
               "cuda:N; a CUDA device torch cannot use is an error"},
    )  # fmt: skip


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """Defaults, then the TOML file, then the flags given on the command line."""
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(read_config_file(args.config, fields))
    for name, value in given_options(args).items():  # a dict option's flags add to its table
        values[name] = {**values.get(name, {}), **value} if isinstance(value, dict) else value
    if args.sites_dir is not None:
        from fed_auc.site import site_files_in

        try:
            found = [str(p) for p in site_files_in(args.sites_dir)]
        except ValueError as exc:
            raise SystemExit(f"fed-auc simulate: --sites-dir: {exc}") from None
        values["site_files"] = [*values.get("site_files", []), *found]
    if values.get("site_files") and args.sites is not None:
        raise SystemExit("fed-auc simulate: give --sites or site files (--site/--sites-dir)")
    try:
        return ExperimentConfig(**values).resolve_files()
    except (TypeError, ValueError) as exc:
        source = f" (config {args.config})" if args.config else ""
        raise SystemExit(f"fed-auc simulate: invalid option{source}: {exc}") from None


def read_config_file(path: Path, fields: set[str]) -> dict[str, Any]:
    """``--config``: the experiment file, every key one of ``fields``."""
    from fed_auc.experiment.files import read_experiment_file

    data = read_experiment_file(path, "simulate")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SystemExit(
            f"fed-auc: config {path}: unknown key(s) {unknown}; valid keys: {sorted(fields)}"
        )
    return data

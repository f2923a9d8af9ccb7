"""``fed-auc simulate`` and ``fed-auc demo``: a federation on this machine with a progress bar,
resumed (``--resume``) or trained once per left-out site (``--leave-each-out``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fed_auc.cli.experiment_options import config_from_args
from fed_auc.cli.text import fmt
from fed_auc.experiment.config import ExperimentConfig

DEMO = {"rounds": 60, "sites": 4, "local_steps": 8, "decay_every": 320}


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the demo federation with the embedded defaults")
    demo.add_argument("--runs-dir", default="runs")
    demo.add_argument("--json", action="store_true")


def simulate_command(args: argparse.Namespace) -> int:
    def run() -> None:
        if args.resume is not None:
            simulate(None, args.json, resume=(resume_runs_dir(args), args.resume))
        elif args.leave_each_out:
            leave_each_out(config_from_args(args), args.json)
        else:
            simulate(config_from_args(args), args.json, args.register, args.models_dir)

    return _explained(args.command, run)


def _explained(command: str, run: Callable[[], None]) -> int:
    """Bad input (a site file, an option the data cannot take) ends in its one-line message,
    never a traceback; the message names the file, field and value. Ctrl-C and SIGTERM mark
    the run failed and say how to resume it."""
    from fed_auc.coordinator.errors import FederationError

    _current_run.clear()
    try:
        with sigterm_as_ctrl_c():
            run()
    except (ValueError, OSError, FederationError) as exc:
        raise SystemExit(f"fed-auc {command}: {exc}") from None
    except KeyboardInterrupt:
        print(f"fed-auc {command}: stopped{_resume_hint()}", file=sys.stderr)
        return 130
    return 0


_stop_asked: list[int] = []  # the signals that asked this command to stop


def _stop(signum: int, frame: object) -> None:
    """Ctrl-C and SIGTERM: remembered, then raised. Python swallows an exception raised in a
    finalizer (``__del__``), so a stop that lands there is raised again at the next round."""
    _stop_asked.append(signum)
    raise KeyboardInterrupt


def raise_a_lost_stop() -> None:
    """Raise the stop the operator asked for if a finalizer swallowed it."""
    if _stop_asked:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM stops like Ctrl-C (KeyboardInterrupt), so the run is closed as stopped; the
    previous handlers are back afterwards (``main`` may run inside another program). A SIGINT
    that the caller ignores (a background job) stays ignored."""
    _stop_asked.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signals.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, _stop) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_current_run: dict[str, str] = {}  # the run this command is training: run_id, runs_dir


def _on_run(runs_dir: str):
    def remember(run_id: str) -> None:
        _current_run.update(run_id=run_id, runs_dir=str(runs_dir))

    return remember


def _resume_hint() -> str:
    """How to continue the run a stop interrupted (it is marked failed, resumable)."""
    if not _current_run:
        return " before a run was created; nothing was recorded"
    run_id, runs_dir = _current_run["run_id"], _current_run["runs_dir"]
    return (
        f"; run {run_id} is marked failed (its finished rounds are kept); continue it with "
        f"`fed-auc simulate --resume {run_id} --runs-dir {runs_dir}`"
    )


def demo_command(args: argparse.Namespace) -> int:
    config = ExperimentConfig(runs_dir=args.runs_dir, **DEMO)
    stopped = _explained("demo", lambda: simulate(config, args.json))
    if stopped:
        return stopped
    if not args.json:
        print(
            f"Every round is in the run store {Path(args.runs_dir) / 'fed_auc.sqlite'}; "
            f"see it with `fed-auc dashboard --runs-dir {args.runs_dir}` "
            f"or list the runs with `fed-auc runs --runs-dir {args.runs_dir}`."
        )
    return 0


def simulate(
    config: ExperimentConfig | None,
    as_json: bool,
    register: str | None = None,
    models_dir: str = "models",
    resume: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``config``, or resume the run ``resume`` = (runs dir, run id), with a progress bar;
    optionally register the exported model."""
    from fed_auc.cli.progress import RoundProgress
    from fed_auc.simulation import rounds_left, run_simulation

    if resume is not None:
        from fed_auc.store.run_store import run_to_resume

        try:
            run_to_resume(*resume, "fed-auc simulate")
        except ValueError as exc:
            raise SystemExit(f"fed-auc simulate --resume: {exc}") from None
        total, desc = rounds_left(*resume), f"resume {resume[1]}"
    else:
        total, desc = config.warmup_rounds + config.rounds, config.algorithm
    progress = RoundProgress(total, desc, warmup=resume is None and config.warmup_rounds > 0)

    def on_round(record) -> None:
        progress.round(record)
        raise_a_lost_stop()

    def on_warmup_round(record) -> None:
        progress.warmup_round(record)
        raise_a_lost_stop()

    def on_run(runs_dir: str, run_id: str) -> None:
        _on_run(runs_dir)(run_id)
        progress.name_class(_positive_class(runs_dir, run_id))

    try:
        if resume is not None:
            on_run(*resume)
            summary = _resume(resume, on_round, on_warmup_round)
        else:
            summary = run_simulation(
                config,
                on_round,
                on_run=lambda run_id: on_run(config.runs_dir, run_id),
                on_warmup_round=on_warmup_round,
            )
    finally:
        progress.close()
    if register:
        from fed_auc.registry.register import register_model

        target = register_model(Path(summary["model_path"]).parent, register, models_dir)
        summary["registered"] = str(target)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        from fed_auc.run.headline import summary_headline

        print(
            f"run {summary['run_id']}: {summary_headline(summary)}; round 0: pooled "
            f"AUC {fmt(summary['global_auc'][0])}"
        )
        print(f"model and model card: {Path(summary['model_path']).parent}")
    return summary


def _positive_class(runs_dir: str, run_id: str) -> str:
    """The positive class the run ``run_id`` recorded for its sites, in words."""
    from fed_auc.metrics.wording import class_text
    from fed_auc.store.facts import run_facts
    from fed_auc.store.run_store import RunStore

    with RunStore(runs_dir) as store:
        return class_text(run_facts(store, run_id, store.run(run_id)["config"])["positive_class"])


def _resume(resume: tuple[str, str], on_round, on_warmup_round) -> dict[str, Any]:
    from fed_auc.coordinator.errors import FederationError
    from fed_auc.simulation import resume_simulation

    try:
        return resume_simulation(*resume, on_round=on_round, on_warmup_round=on_warmup_round)
    except (ValueError, FederationError) as exc:
        raise SystemExit(f"fed-auc simulate --resume: {exc}") from None


def resume_runs_dir(args: argparse.Namespace) -> str:
    """``--resume`` takes every option from the recorded run; only where it lives may be given,
    and ``fed-auc --threads`` (this machine's cores, not the run's)."""
    given = [
        name
        for name, value in vars(args).items()
        if value not in (None, False)
        and name not in ("command", "resume", "runs_dir", "json", "models_dir", "threads")
    ]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise SystemExit(f"fed-auc simulate --resume uses the run's recorded options; drop {flags}")
    return args.runs_dir or "runs"


def leave_each_out(config: ExperimentConfig, as_json: bool) -> list[dict[str, Any]]:
    """``fed-auc simulate --leave-each-out``: one run with every site, one per site without it."""
    import dataclasses

    from fed_auc.run.holdout import leave_each_out as run_all
    from fed_auc.simulation import load_in_process_sites, run_simulation

    if config.hold_out:
        raise SystemExit("fed-auc simulate: --leave-each-out chooses the held-out sites itself")
    names = [site.data.name for site in load_in_process_sites(config)[0]]

    def train(held_out: list[str]) -> dict[str, Any]:
        print(f"leave-each-out: training without {held_out or 'no site'}", file=sys.stderr)
        return run_simulation(
            dataclasses.replace(config, hold_out=held_out), on_run=_on_run(config.runs_dir)
        )

    rows = run_all(names, train)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print_leave_each_out(rows)
    return rows


def print_leave_each_out(rows: list[dict[str, Any]]) -> None:
    """One line per site: the test AUC of the exported model of the run without it beside
    that of the run with every site, each run named, and the positive class."""
    from fed_auc.metrics.wording import class_text

    for row in rows:
        held, within = row["held_out_auc"], row["in_federation_auc"]
        print(
            f"{row['site']:<20} held out: test AUC {_aucs(held)} (exported model of run "
            f"{row['held_out_run']})  in federation: test AUC {_aucs(within)} (run "
            f"{row['in_federation_run']}); positive class {class_text(row.get('positive_class'))}"
        )


def _aucs(values: list[float | None] | None) -> str:
    if values is None:
        return "not reported"
    return "/".join("undefined" if v is None else f"{v:.3f}" for v in values)

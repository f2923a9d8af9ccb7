"""The ``fed-auc`` command: simulate, demo, evaluate, export, predict, runs, dashboard,
convert-weights; coordinator, node, certs (Flower).

One module per subcommand (its flags and its handler); this one puts them under one parser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from fed_auc.cli import federation as flower_cli
from fed_auc.cli.dashboard_process import add_dashboard_parser, dashboard_command
from fed_auc.cli.data import add_data_card_parser, write_data_cards
from fed_auc.cli.evaluate import add_evaluate_parser, evaluate_command
from fed_auc.cli.experiment_options import add_simulate_parser
from fed_auc.cli.export import add_export_parser, export_command
from fed_auc.cli.predict import add_predict_parser, predict_command
from fed_auc.cli.runs import add_runs_parser, runs_command
from fed_auc.cli.simulate import DEMO, add_demo_parser, demo_command, simulate_command
from fed_auc.cli.weights import add_convert_parser, convert_command
from fed_auc.threads import apply_threads, parse_threads

__all__ = ["DEMO", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fed-auc", description="Federated deep AUC maximization on medical images."
    )
    parser.add_argument(
        "--threads",
        type=_threads_arg,
        default=None,
        help="torch CPU threads, or 'auto' (default): the cores the load average leaves idle",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    add_demo_parser(sub)
    add_data_card_parser(sub)
    add_evaluate_parser(sub)
    add_export_parser(sub)
    add_predict_parser(sub)
    add_runs_parser(sub)
    add_dashboard_parser(sub)
    add_convert_parser(sub)
    flower_cli.add_parsers(sub)
    return parser


def _threads_arg(value: str) -> int | None:
    try:
        return parse_threads(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _coordinator_command(args: argparse.Namespace) -> int:
    import signal

    flower_cli.require_flower("coordinator")
    from fed_auc.transport.flower.launch import CoordinatorFailed

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C
    try:
        flower_cli.coordinator(args)
    except KeyboardInterrupt as stop:  # the SuperLink and what it started are stopped too
        print(f"fed-auc coordinator: {stop or 'stopped; the run is marked failed (resumable)'}",
              file=sys.stderr)  # fmt: skip
        return 130
    except CoordinatorFailed as exc:  # one line: what failed, how to go on
        print(f"fed-auc coordinator: {exc}", file=sys.stderr)
        return 1
    return 0


def _certs_command(args: argparse.Namespace) -> int:
    flower_cli.certs(args)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "simulate": simulate_command,
    "demo": demo_command,
    "data-card": write_data_cards,
    "evaluate": evaluate_command,
    "export": export_command,
    "predict": predict_command,
    "runs": runs_command,
    "dashboard": dashboard_command,
    "coordinator": _coordinator_command,
    "node": flower_cli.node,
    "certs": _certs_command,
    "convert-weights": convert_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    # One line per round as it happens, also when the output is a file or a pipe.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if len(extra) == 1 and getattr(args, "action", None) == "approve" and args.digest is None:
        args.digest = extra[0]  # `node approve --site FILE DIGEST`: a positional after an option
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    apply_threads(args.threads)
    return COMMANDS[args.command](args)

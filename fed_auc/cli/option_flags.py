"""The experiment's options as command-line flags, made from their declarations
(``fed_auc.experiment.option``): the flag, its type, its help with the default in words. A flag
not given is None, so the config file's value or the declared default stands."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.kinds import OneOf
from fed_auc.experiment.option import GROUPS, Option, declared_options, describe_default, flag_of

_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def add_option_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    names: Iterable[str] | None = None,
    helps: dict[str, str] | None = None,
) -> None:
    """Add the flags of the options ``names`` (all that have one when None), in declaration
    order; ``helps`` replaces an option's help where another command uses it differently."""
    declared = declared_options(ExperimentConfig)
    wanted = list(declared) if names is None else list(names)
    for name in wanted:
        field, opt = declared[name]
        if opt is None or flag_of(name, opt) is None:
            if names is not None:
                raise ValueError(f"option {name!r} has no command-line flag")
            continue
        help_text = (helps or {}).get(name, opt.help)
        parser.add_argument(flag_of(name, opt), dest=name, help=_help(help_text, field, opt),
                            **_argument_kind(field, opt))  # fmt: skip


def add_grouped_option_flags(parser: argparse.ArgumentParser) -> None:
    """Every option's flag, under the headings of docs/options.md (``--help`` reads like it)."""
    declared = declared_options(ExperimentConfig)
    for group, title in GROUPS.items():
        names = [
            name
            for name, (_, opt) in declared.items()
            if opt is not None and opt.group == group and flag_of(name, opt) is not None
        ]
        add_option_flags(parser.add_argument_group(title), names)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given as flags (repeated NAME=VALUE pairs of a dict option as a dict)."""
    given = {}
    for name, (field, _) in declared_options(ExperimentConfig).items():
        value = getattr(args, name, None)
        if value is None:
            continue
        given[name] = dict(value) if str(field.type).startswith("dict") else value
    return given


def _help(text: str, field: dataclasses.Field, opt: Option) -> str:
    choices = f"; one of {opt.check.describe()}" if isinstance(opt.check, OneOf) else ""
    default = describe_default(field, opt)
    words = text + choices + (f" (default: {default})" if default != "—" else "")
    return words.replace("`", "").replace("%", "%%")


def _argument_kind(field: dataclasses.Field, opt: Option) -> dict[str, Any]:
    """argparse's keywords for the field's type: a switch, a parsed text, a repeated flag."""
    kinds = [kind.strip() for kind in str(field.type).split("|") if kind.strip() != "None"]
    if kinds == ["bool"]:
        return {"action": "store_true", "default": None}
    parse = opt.parse or _TYPES.get(kinds[0], str)
    kind: dict[str, Any] = {"type": _argparse_type(parse)}
    if opt.metavar:
        kind["metavar"] = opt.metavar
    if opt.repeat:
        kind["action"] = "append"
    return kind


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` whose ValueError argparse shows as it is (not "invalid value")."""
    if parse in (int, float, str):
        return parse

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parsed.__name__ = getattr(parse, "__name__", "value")
    return parsed

"""One declaration per option of an experiment: ``option(...)`` on an ``ExperimentConfig`` field
gives its config-file key (the field's name), its command-line flag, its check and its row in
the option tables of docs/options.md (``python -m fed_auc.experiment.option_tables``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The groups of the option tables, in the order docs/options.md lists them.
GROUPS = {
    "federation": "Federation",
    "training": "Training",
    "recipe": "The real-data recipe",
    "weak_sites": "Weak sites and personal models",
    "protection": "Robustness and privacy",
    "data": "Data",
    "compute": "Compute and outputs",
}


@dataclass(frozen=True)
class Option:
    """What one option is for a person: its help, its group, and how it is written and checked.

    ``flag``: None for ``--name-with-dashes``, or another spelling (``--delta``), or "" for a
    key of the config file only. ``parse`` reads the flag's text (default: the field's type).
    ``repeat``: the flag may be given several times (a list, or NAME=VALUE pairs of a dict).
    ``doc``: the table's longer text when the help is not enough; ``default_doc``: the default
    in words when the field's default (None) means "chosen from the data" or similar.
    ``simulated``: it describes a simulated federation, so over Flower it is refused."""

    help: str
    group: str
    check: Callable[[str, Any], None] | None = None
    flag: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    repeat: bool = False
    doc: str | None = None
    default_doc: str | None = None
    simulated: bool = False

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"option group must be one of {list(GROUPS)}, got {self.group!r}")


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **what):
    """A dataclass field declared as an experiment option (``what``: ``Option``'s fields)."""
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"option": Option(**what)}
    )


def declared_options(config_class: type) -> dict[str, tuple[dataclasses.Field, Option | None]]:
    """Every field of ``config_class`` in declaration order, with its ``Option`` (None for a
    field that is not an option a person sets, such as ``transport``)."""
    return {f.name: (f, f.metadata.get("option")) for f in dataclasses.fields(config_class)}


def flag_of(name: str, declared: Option) -> str | None:
    """The command-line flag of option ``name`` (None: config file only)."""
    if declared.flag == "":
        return None
    return declared.flag or "--" + name.replace("_", "-")


def simulated_federation(config_class: type) -> tuple[str, ...]:
    """The options that describe a simulated federation (how many sites, one data set split
    among them): each node owns its data over Flower."""
    return tuple(
        name for name, (_, opt) in declared_options(config_class).items() if opt and opt.simulated
    )


def describe_default(field: dataclasses.Field, declared: Option) -> str:
    """The default in words, for a help text and a table row."""
    if declared.default_doc is not None:
        return declared.default_doc
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if default is False:
        return "off"
    if default is None or default == {}:
        return "—"
    return f"`{default}`" if isinstance(default, str) else str(default)

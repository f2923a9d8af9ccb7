"""The option tables of docs/options.md, written from the options' declarations: a row per option
(its flag, its config-file key where that is not the flag's name, what it does, its default).
``python -m fed_auc.experiment.option_tables`` rewrites every table between
``<!-- options: GROUP -->`` and ``<!-- /options -->``; a test fails while one is stale."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.kinds import OneOf
from fed_auc.experiment.option import GROUPS, declared_options, describe_default, flag_of

OPTIONS_DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"
_TABLE = re.compile(r"(<!-- options: (\w+) -->\n).*?(<!-- /options -->)", re.DOTALL)


def option_table(group: str) -> str:
    """The Markdown table of one group's options, in declaration order."""
    if group not in GROUPS:
        raise ValueError(f"option group must be one of {list(GROUPS)}, got {group!r}")
    rows = ["| option | what it does | default |", "|---|---|---|"]
    for name, (field, opt) in declared_options(ExperimentConfig).items():
        if opt is None or opt.group != group:
            continue
        flag = flag_of(name, opt)
        if flag is None:
            written = f"`{name}` (config file only)"
        elif flag == "--" + name.replace("_", "-"):
            written = f"`{flag}`"
        else:
            written = f"`{flag}` (key `{name}`)"
        text = opt.doc or opt.help
        if isinstance(opt.check, OneOf) and not all(
            f"`{choice}`" in text for choice in opt.check.values()
        ):
            text += f"; one of {opt.check.describe()}"
        rows.append(f"| {written} | {text} | {describe_default(field, opt)} |")
    return "\n".join(rows) + "\n"


def with_tables(text: str) -> str:
    """``text`` with every marked table rewritten from the declarations."""
    return _TABLE.sub(lambda m: m.group(1) + option_table(m.group(2)) + m.group(3), text)


def main() -> int:
    text = OPTIONS_DOC.read_text()
    updated = with_tables(text)
    if updated != text:
        OPTIONS_DOC.write_text(updated)
        print(f"rewrote the option tables of {OPTIONS_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

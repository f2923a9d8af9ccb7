"""Each option of an experiment is declared once: the declaration gives the flag, the config-file
key, the check (in one style: "NAME must be ..., got VALUE") and the row of docs/options.md; and
building a config reads no file (``resolve_files`` does, once, before a run)."""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import math
import pathlib

import pytest

from fed_auc.cli.experiment_options import add_simulate_parser, config_from_args
from fed_auc.experiment.config import SIMULATED_FEDERATION, ExperimentConfig
from fed_auc.experiment.kinds import Integer, Interval, OneOf, Parsed
from fed_auc.experiment.option import GROUPS, declared_options, flag_of
from fed_auc.experiment.option_tables import OPTIONS_DOC, with_tables

DECLARED = declared_options(ExperimentConfig)
NOT_OPTIONS = {"transport"}  # set by the command (simulate or coordinator), never by a person


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    return parser


def _from_flags(*flags: str) -> ExperimentConfig:
    return config_from_args(_parser().parse_args(["simulate", *flags]))


def _from_file(tmp_path: pathlib.Path, toml: str) -> ExperimentConfig:
    path = tmp_path / "experiment.toml"
    path.write_text(toml)
    return _from_flags("--config", str(path))


def test_every_field_of_the_config_is_a_declared_option_in_a_known_group():
    undeclared = [name for name, (_, opt) in DECLARED.items() if opt is None]
    assert set(undeclared) == NOT_OPTIONS
    assert {opt.group for _, opt in DECLARED.values() if opt} <= set(GROUPS)


def test_every_flag_is_in_simulate_help_and_no_two_options_share_one(capsys):
    flags = [flag_of(name, opt) for name, (_, opt) in DECLARED.items() if opt]
    flags = [flag for flag in flags if flag is not None]
    assert len(flags) == len(set(flags))
    with pytest.raises(SystemExit):
        _parser().parse_args(["simulate", "--help"])
    helped = capsys.readouterr().out
    assert [flag for flag in flags if f"  {flag} " not in helped] == []


@pytest.mark.parametrize(
    ("flags", "toml"),
    [
        (["--rounds", "3"], "rounds = 3"),
        (["--participation", "0.5"], "participation = 0.5"),
        (["--tta", "flip"], 'tta = "flip"'),
        (["--secure-aggregation"], "secure_aggregation = true"),
        (["--hold-out", "north", "--hold-out", "south"], 'hold_out = ["north", "south"]'),
        (
            ["--partial-training", "--site-memory", "1.0,0.4,0.15,64MiB"],
            'partial_training = true\nsite_memory = ["1.0", "0.4", "0.15", "64MiB"]',
        ),
        (["--site-local-steps", "2,3,4,5"], "site_local_steps = [2, 3, 4, 5]"),
        (["--backend-option", "dual_lr=0.5"], "[backend_options]\ndual_lr = 0.5"),
        (["--delta", "1e-6", "--dp-clip", "1.0"], "dp_delta = 1e-6\ndp_clip = 1.0"),
    ],
)
def test_a_flag_and_its_config_file_key_make_the_same_config(tmp_path, flags, toml):
    by_flags, by_file = _from_flags(*flags).to_dict(), _from_file(tmp_path, toml).to_dict()
    assert by_flags == by_file
    assert by_flags != ExperimentConfig().to_dict()


def test_flags_add_to_the_config_file_s_backend_options_table(tmp_path):
    path = tmp_path / "experiment.toml"
    path.write_text("[backend_options]\ndual_lr = 0.5\n")
    config = _from_flags("--config", str(path), "--backend-option", "site_weighting=examples")
    assert config.backend_options == {"dual_lr": 0.5, "site_weighting": "examples"}


def _bad_value(check) -> object:
    """A value the check must refuse."""
    if isinstance(check, OneOf):
        return "nonsense"
    if isinstance(check, Integer):
        return check.low - 1
    if isinstance(check, Interval):
        return check.low - 1 if math.isinf(check.high) else check.high + 1
    assert isinstance(check, Parsed), check
    return "nonsense::"


CHECKED = [(name, opt.check) for name, (_, opt) in DECLARED.items() if opt and opt.check]


def test_the_declared_checks_cover_the_choice_and_range_options():
    assert len(CHECKED) >= 25
    assert {"algorithm", "rounds", "participation", "select", "partition", "dp"} <= {
        name for name, _ in CHECKED
    }


@pytest.mark.parametrize(("name", "check"), CHECKED, ids=[name for name, _ in CHECKED])
def test_each_declared_check_refuses_in_one_style_naming_option_and_value(name, check):
    bad = _bad_value(check)
    with pytest.raises(ValueError) as refused:
        ExperimentConfig(**{name: bad})
    message = str(refused.value)
    assert message.startswith(f"{name} must be "), message
    assert f"got {bad!r}" in message


def test_the_option_tables_of_the_docs_are_written_from_the_declarations():
    text = OPTIONS_DOC.read_text()
    assert with_tables(text) == text, "run python -m fed_auc.experiment.option_tables"
    for name, (_, opt) in DECLARED.items():
        if opt is not None:
            shown = flag_of(name, opt) or name
            assert f"| `{shown}`" in text, f"{name} has no row in {OPTIONS_DOC.name}"


def test_the_options_refused_over_flower_are_the_ones_declared_as_a_simulated_federation():
    assert "sites" in SIMULATED_FEDERATION and "site_files" in SIMULATED_FEDERATION
    assert "rounds" not in SIMULATED_FEDERATION
    for name in SIMULATED_FEDERATION:
        assert DECLARED[name][1].simulated


def test_building_a_config_reads_no_file_and_resolving_it_names_what_is_missing(
    tmp_path, monkeypatch
):
    missing_site = tmp_path / "north.toml"
    missing_init = tmp_path / "weights.pt"

    def no_file(*args, **kwargs):
        raise AssertionError(f"a config build opened a file: {args}")

    with monkeypatch.context() as patched:
        patched.setattr(builtins, "open", no_file)
        patched.setattr(pathlib.Path, "exists", no_file)
        patched.setattr(pathlib.Path, "read_bytes", no_file)
        config = ExperimentConfig(site_files=[str(missing_site)], init=str(missing_init))
    assert config.sites == 1
    with pytest.raises(ValueError, match="init: no such file or folder"):
        config.resolve_files()
    config = dataclasses.replace(config, init=None)
    with pytest.raises(ValueError, match="north.toml"):
        config.resolve_files()

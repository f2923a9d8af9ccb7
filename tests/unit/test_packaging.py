"""The README's promises: CI runs its test command; shipped configs are valid."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fed_auc.cli.simulate import DEMO
from fed_auc.experiment.config import ExperimentConfig
from tests.support.paths import ROOT


def _quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quickstart)


def test_readme_has_two_quickstart_commands_and_ci_runs_the_test_one():
    demo, tests = _quickstart_commands()
    assert demo.endswith("fed-auc demo") and "-c constraints.txt" in demo
    assert "pytest" in tests and "-c constraints.txt" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_torch_install_the_docs_give_is_the_pinned_version():
    """The constraints file pins torch; the README's CPU-only line, the GPU node's line and
    the Dockerfile install that same version, so the later `-c constraints.txt` keeps it."""
    pinned = re.findall(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)
    assert len(pinned) == 1
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    names = ("README.md", "hospitals/README.md", "Dockerfile", *docs)
    texts = [(ROOT / name).read_text() for name in names]
    every = [v for text in texts for v in re.findall(r"torch==(\d[\w.+]*\w)", text)]
    assert set(every) == set(pinned), every  # no doc names another torch
    installs = [v for text in texts for v in re.findall(r"--index-url \S+ torch==(\S+)", text)]
    assert len(installs) >= 3 and set(installs) == set(pinned)
    readme = texts[0]
    assert "https://download.pytorch.org/whl/cpu torch==" in readme  # the CPU-only machine
    assert "CUDA build" in readme.split("## What the demo does")[0]  # what PyPI gives, said


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    data = tomllib.loads(path.read_text())
    if "flower" in data:  # an experiment for `fed-auc coordinator`
        from fed_auc.experiment.files import load_experiment

        load_experiment(path, {})
    else:
        ExperimentConfig(**data)


def test_demo_config_file_matches_the_embedded_demo():
    assert tomllib.loads((ROOT / "configs" / "demo.toml").read_text()) == DEMO


def _imports(path: Path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_transport_imports_the_simulation_or_private_synthetic_helpers():
    """The layout DESIGN.md fixes: transports share the experiment, site and node code and
    never reach into the in-process simulation; the library never imports Streamlit."""
    for path in (ROOT / "fed_auc" / "transport").rglob("*.py"):
        imported = _imports(path)
        assert "fed_auc.simulation" not in imported, path
        assert "fed_auc.data.synthetic" not in imported, path  # sites come from fed_auc.site
    for path in (ROOT / "fed_auc").rglob("*.py"):
        assert not any(name.split(".")[0] == "streamlit" for name in _imports(path)), path

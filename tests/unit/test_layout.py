"""The layout DESIGN.md fixes, guarded: one folder per concept, floors that imports respect,
no import circle, modules of one concept's size, one name rule, and a README that lists the
tree as it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "fed_auc"
LOW = ("exchange", "metrics", "algorithms", "privacy", "node", "coordinator")
HIGH = ("experiment", "run", "transport", "cli")
MAX_TOP_LEVEL_MODULES = 10
MAX_LINES = 450


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The fed_auc modules ``path`` imports anywhere: at module level, inside functions and
    in TYPE_CHECKING blocks (a type-only or deferred import is a dependency too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fed_auc"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fed_auc")}
    return found & set(MODULES)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == f"fed_auc.{p}" or module.startswith(f"fed_auc.{p}.") for p in packages)


def test_the_lower_floors_never_import_the_experiment_the_run_a_transport_or_a_command():
    upward = [
        (module, imported)
        for module, path in MODULES.items()
        if _in(module, LOW)
        for imported in _imports(path)
        if _in(imported, HIGH)
    ]
    assert upward == []


def test_secure_aggregation_primitives_never_import_the_coordinator_and_transports_no_command():
    for module, path in MODULES.items():
        if _in(module, ("privacy.secure",)):
            assert not any(_in(i, ("coordinator",)) for i in _imports(path)), module
        if _in(module, ("transport",)):
            assert not any(_in(i, ("cli", "simulation")) for i in _imports(path)), module


def test_the_package_has_no_import_circle():
    """Counting every import, deferred and type-only ones too: a circle hidden behind a
    function-level or TYPE_CHECKING import is still two modules that need each other."""
    graph = {m: _imports(p) for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                circle = path[path.index(imported) :] + [imported]
                pytest.fail(f"import circle: {' -> '.join(circle)}")
            if imported not in state:
                visit(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_a_folder_per_concept_and_modules_of_one_concepts_size():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    ours = [p for d in ("app", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    hidden = [p for p in ours if any(x.startswith(".") for x in p.relative_to(ROOT).parts)]
    code = [*MODULES.values(), *(p for p in ours if p not in hidden)]
    longest = max(code, key=lambda p: len(p.read_text().splitlines()))
    assert len(longest.read_text().splitlines()) <= MAX_LINES, longest


def test_one_name_rule_for_site_files_synthetic_profiles_and_registered_models(tmp_path):
    from fed_auc.data.synthetic import SiteProfile
    from fed_auc.registry.register import register_model
    from fed_auc.site import SiteDefinition

    site = tmp_path / "zurich.toml"
    site.write_text('name = "Zürich"\n\n[data]\nspec = "synthetic"\n')
    message = "'Zürich': letters, digits, '_', '.' and '-' (ASCII)"
    with pytest.raises(ValueError, match=re.escape(message)):
        SiteDefinition.from_toml(site)
    with pytest.raises(ValueError, match=re.escape(message)):
        SiteProfile(name="Zürich", n_train=10, n_val=2, n_test=2, prevalence=0.2)
    with pytest.raises(ValueError, match=re.escape(message)):
        register_model(tmp_path, "Zürich", tmp_path / "models")


def _readme_layout() -> str:
    readme = (ROOT / "docs" / "developer.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```\n(.*?)```", section, re.S).group(1)


def test_the_readme_layout_lists_the_tree_as_it_is():
    """Every top-level module and package of fed_auc/ has its line, every module of a
    package is named on its package's lines, and nothing listed is missing from the tree."""
    block = _readme_layout()
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        match = re.match(r"  (\w+)(\.py|/)\s", line + " ")
        if match and not line.startswith("   "):
            current = match.group(1) + match.group(2)
            entries[current] = line
        elif current is not None and line.startswith("    "):
            entries[current] += " " + line
        elif not line.startswith(" "):
            current = None
    modules = {p.name for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    packages = {p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(entries) == modules | packages
    for package in packages:
        text = entries[package]
        inside = {p.stem for p in (PACKAGE / package).glob("*.py") if not p.stem.startswith("__")}
        inside |= {p.name for p in (PACKAGE / package).iterdir() if (p / "__init__.py").exists()}
        missing = sorted(m for m in inside if not re.search(rf"\b{m}\b", text))
        assert missing == [], (package, missing)


def test_below_the_run_code_gets_plain_settings_never_the_experiment_config():
    """The run turns the experiment config into plain settings once (a node setup, the
    coordinator's arguments, card settings); only the layers above it read the config."""
    above = ("experiment", "run", "cli", "transport", "simulation")
    readers = sorted(
        module
        for module, path in MODULES.items()
        if "ExperimentConfig" in path.read_text() and not _in(module, above)
    )
    assert readers == []


def _calls(path: Path, name: str) -> bool:
    """Whether ``path`` calls a function or method named ``name``."""
    return any(
        isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == name or getattr(node.func, "id", None) == name)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_only_the_run_frame_the_evaluation_job_and_the_store_create_or_fail_a_run():
    """A training run is created by the frame (``run.frame.new_run``), an evaluation run by
    the evaluation job; a run's failure is recorded the store's one way."""
    creators = sorted(m for m, p in MODULES.items() if _calls(p, "create_run"))
    assert creators == ["fed_auc.evaluate.job", "fed_auc.run.frame"]
    failers = sorted(m for m, p in MODULES.items() if _calls(p, "fail_run"))
    assert failers == ["fed_auc.store.run_store"]
    finishers = [m for m, p in MODULES.items() if "finish_run(run_id, \"failed\"" in p.read_text()]
    assert finishers == ["fed_auc.store.run_store"]


def test_both_entry_points_go_through_the_one_run_frame():
    """``simulate`` and the Flower ServerApp are each a short function into
    ``run_federation``; neither opens, trains or closes a run itself."""
    for module in ("fed_auc.simulation", "fed_auc.transport.flower.server"):
        path = MODULES[module]
        assert _calls(path, "run_federation"), module
        steps = {"fed_auc.run.lifecycle", "fed_auc.run.start", "fed_auc.run.warmup"}
        assert not _imports(path) & steps, module
    assert not any(_in(m, ("evaluate",)) and _in(i, ("run",))
                   for m, p in MODULES.items() for i in _imports(p))  # fmt: skip

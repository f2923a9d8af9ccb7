"""benchmarks/ and tests/ import as packages from the repository root: the benchmarks import
nothing from tests/, and no file in either patches ``sys.path``."""

from __future__ import annotations

import ast
import re

from tests.support.paths import ROOT

FOLDERS = ("benchmarks", "tests")


def _python_files(folder: str):
    return sorted(p for p in (ROOT / folder).rglob("*.py") if ".libauc" not in p.parts)


def _imported_modules(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_benchmarks_import_nothing_from_tests():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imported_modules(path) if m == "tests" or m.startswith("tests.")
        )  # fmt: skip
        for path in _python_files("benchmarks")
    }
    assert not {path: mods for path, mods in offenders.items() if mods}


def test_no_file_patches_sys_path():
    # sys.path.insert/append/extend, sys.path[...] = ..., or site.addsitedir, in code or in the
    # code a file hands to a child interpreter
    patch = re.compile(
        r"sys\.path\s*(\.\s*(insert|append|extend)\s*\(|\[[^\]]*\]\s*=|\+=)|addsitedir"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in FOLDERS
        for path in _python_files(folder)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if patch.search(line) and path.name != "test_test_layout.py"
    ]
    assert not offenders


# Test files at the top of tests/unit/ that test the repository, or a script, rather than a
# top-level module of fed_auc named like them.
REPOSITORY_TESTS = {"doc_links", "layout", "packaging", "test_layout", "split_medmnist"}


def test_unit_tests_are_laid_out_like_the_package():
    """tests/unit/X/ tests fed_auc/X/; a test at the top tests a top-level module of fed_auc
    (test_federation: the simulation) or the repository."""
    unit = ROOT / "tests" / "unit"
    folders = [p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert [f for f in folders if not (ROOT / "fed_auc" / f / "__init__.py").exists()] == []
    modules = {p.stem for p in (ROOT / "fed_auc").glob("*.py")} | {"federation"}
    top = {p.stem.removeprefix("test_") for p in unit.glob("test_*.py")}
    assert sorted(top - modules - REPOSITORY_TESTS) == []

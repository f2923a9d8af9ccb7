"""Flower is pinned to the exact version fed-auc's patches were written against.

fed-auc reaches past Flower's public API (``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``):
it patches the SuperNode's sleeps and the object-pull backoff, runs ClientApp tasks and registers
node keys the way Flower's own code does, and imports internal modules for it. A Flower release
may change any of these without notice, so the pin is exact (pyproject.toml, constraints.txt),
and each internal object fed-auc relies on is recorded here with a fingerprint of its source as
it was at the pinned version. Moving the pin (hospitals/README.md, "The Flower version"): a
changed fingerprint names the object and the fed-auc file that relies on it; review that file
against the new source, then record the new fingerprint the failure prints.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import re
import tomllib
from importlib.metadata import version
from typing import Any

import pytest

from tests.support.paths import ROOT

pytest.importorskip("flwr")

PUBLIC = ("flwr.app", "flwr.clientapp", "flwr.serverapp")  # Flower's documented API
FLOWER = "fed_auc/transport/flower"
PATCHES = "patches"  # what fed-auc does with the object, in the failure message
COPIES = "follows the steps of"
IMPORTS = "imports"


# (module, attribute path) → (fed-auc file, how it relies on it, fingerprint at the pin).
INTERNALS: dict[tuple[str, str], tuple[str, str, str]] = {
    # Monkeypatched: the module's ``time`` is replaced, so every sleep in it is capped.
    ("flwr.supernode", "start_client_internal"):
        (f"{FLOWER}/supernode.py", PATCHES, "d6342f743fdf"),
    ("flwr.supernode.cli.flower_supernode", "flower_supernode"):
        (f"{FLOWER}/supernode.py", IMPORTS, "e263e1045207"),
    # Monkeypatched: their keyword defaults carry the backoff (``shorten``, ``time_limit``).
    ("flwr.supercore.inflatable", "inflatable_utils.pull_objects"):
        (f"{FLOWER}/backoff.py", PATCHES, "31bb2de46b45"),
    ("flwr.supercore.inflatable", "inflatable_utils.pull_and_inflate_object_from_tree"):
        (f"{FLOWER}/backoff.py", PATCHES, "139811483a15"),
    ("flwr.supercore", "constant.PULL_MAX_TIME"):
        (f"{FLOWER}/backoff.py", IMPORTS, "3c5d8ca315f8"),
    # The warm executor runs a ClientApp task as ``flwr-clientapp`` does, with its pieces.
    ("flwr.supernode.runtime.run_clientapp", "run_clientapp"):
        (f"{FLOWER}/executor.py", COPIES, "6ce09559f3a2"),
    ("flwr.supernode.runtime.run_clientapp", "pull_task_input"):
        (f"{FLOWER}/executor.py", IMPORTS, "5607a23e1673"),
    ("flwr.supernode.runtime.run_clientapp", "push_message"):
        (f"{FLOWER}/executor.py", IMPORTS, "07cb512c93e0"),
    ("flwr.supernode.runtime.run_clientapp", "push_task_output"):
        (f"{FLOWER}/executor.py", IMPORTS, "9206407456e7"),
    ("flwr.common.constant", "ErrorCode"): (f"{FLOWER}/executor.py", IMPORTS, "4889fc3e5b66"),
    ("flwr.common.constant", "SubStatus"): (f"{FLOWER}/executor.py", IMPORTS, "3250f760cd33"),
    ("flwr.proto.runtime_pb2", "AcquireTaskRequest"):
        (f"{FLOWER}/executor.py", IMPORTS, "d89550f38416"),
    ("flwr.supercore.constant", "TaskType"): (f"{FLOWER}/executor.py", IMPORTS, "83fa24c88e92"),
    ("flwr.supercore.heartbeat", "HeartbeatSender"):
        (f"{FLOWER}/executor.py", IMPORTS, "27714c8e3512"),
    ("flwr.supercore.heartbeat", "make_task_heartbeat_fn_http"):
        (f"{FLOWER}/executor.py", IMPORTS, "a50247986fc7"),
    ("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor"):
        (f"{FLOWER}/executor.py", IMPORTS, "06cbf14d2ea8"),
    ("flwr.supercore.retry.retry_invoker", "RetryInvoker"):
        (f"{FLOWER}/executor.py", IMPORTS, "c07ea29e28e9"),
    ("flwr.supercore.retry.retry_invoker", "exponential"):
        (f"{FLOWER}/executor.py", IMPORTS, "f3b566f7b0b1"),
    ("flwr.supercore.runtime", "RuntimeHttpClient"):
        (f"{FLOWER}/executor.py", IMPORTS, "9d66e89a6205"),
    # Node keys are registered as ``flwr supernode register`` does, in-process.
    ("flwr.cli.supernode.register", "register"): (f"{FLOWER}/launch.py", COPIES, "2168865eb4ba"),
    ("flwr.cli.supernode.register", "try_load_public_key"):
        (f"{FLOWER}/launch.py", IMPORTS, "fb55db7c4bc5"),
    ("flwr.cli.flower_config", "read_superlink_connection"):
        (f"{FLOWER}/launch.py", IMPORTS, "c2278ea2832c"),
    ("flwr.cli.utils", "init_http_client_from_connection"):
        (f"{FLOWER}/launch.py", IMPORTS, "4d3408f63551"),
    ("flwr.proto.control_pb2", "RegisterNodeRequest"):
        (f"{FLOWER}/launch.py", IMPORTS, "4ca174270bab"),
    ("flwr.supercore.exit", "add_exit_handler"):
        (f"{FLOWER}/coordinator_watch.py", IMPORTS, "c153212885df"),
    # Shamir secret sharing for secure aggregation.
    ("flwr.common.secure_aggregation.crypto.shamir", "create_shares"):
        ("fed_auc/privacy/secure/crypto.py", IMPORTS, "d922b6370cd5"),
    ("flwr.common.secure_aggregation.crypto.shamir", "combine_shares"):
        ("fed_auc/privacy/secure/crypto.py", IMPORTS, "e9339f2cd706"),
}  # fmt: skip


def _pinned(requirement: str) -> str | None:
    match = re.fullmatch(r"flwr==(\S+)", requirement.replace(" ", ""))
    return match.group(1) if match else None


def _resolve(module: str, path: str) -> Any:
    """``module`` then each dotted part of ``path``, a submodule imported where needed."""
    obj: Any = importlib.import_module(module)
    name = module
    for part in path.split("."):
        name = f"{name}.{part}"
        obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(name)
    return obj


def fingerprint(obj: Any) -> str:
    """The first 12 hex digits of the SHA-256 of what fed-auc relies on: a module's, class's
    or function's source; a protobuf message's field names; else the value's repr."""
    descriptor = getattr(obj, "DESCRIPTOR", None)
    if descriptor is not None and hasattr(descriptor, "fields"):
        text = " ".join(f"{f.name}:{f.type}" for f in descriptor.fields)
    elif inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj):
        text = inspect.getsource(obj)
    else:
        text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _flower_imports() -> dict[tuple[str, str], set[str]]:
    """Every ``(module, name)`` fed-auc imports from Flower, with the files that do."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted((ROOT / "fed_auc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flwr":
                pairs = [(str(node.module), alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names if a.name.split(".")[0] == "flwr"]
            else:
                continue
            for pair in pairs:
                found.setdefault(pair, set()).add(str(path.relative_to(ROOT)))
    return found


def test_flower_is_pinned_to_one_exact_version_everywhere():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    flowers = [r for deps in extras.values() for r in deps if r.replace(" ", "").startswith("flwr")]
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    flowers += [line for line in constraints if line.startswith("flwr")]
    pins = {_pinned(r) for r in flowers}
    assert len(flowers) >= 3 and len(pins) == 1 and None not in pins, (
        f"Flower must be pinned exactly (flwr==X.Y.Z) in pyproject.toml and constraints.txt, "
        f"one version everywhere: {flowers}"
    )
    pinned = pins.pop()
    assert version("flwr") == pinned, (
        f"flwr {version('flwr')} is installed, fed-auc is pinned to {pinned}: "
        "pip install -c constraints.txt -e '.[test]'"
    )


def test_every_internal_flower_import_is_recorded():
    """A new import of Flower's internals is added to ``INTERNALS``, with its fingerprint."""
    covered = {(module, path.split(".")[0]) for module, path in INTERNALS}
    covered.add(("flwr", ""))  # a bare ``import flwr``: is the Flower extra installed?
    unrecorded = {
        f"{module}.{name}": sorted(files)
        for (module, name), files in _flower_imports().items()
        if module not in PUBLIC and (module, name) not in covered
    }
    assert not unrecorded, f"record these in {__name__}.INTERNALS: {unrecorded}"


@pytest.mark.parametrize("module", PUBLIC)
def test_the_public_flower_names_fed_auc_imports_exist(module):
    imported = [name for (m, name), _ in _flower_imports().items() if m == module and name]
    missing = [name for name in imported if not hasattr(importlib.import_module(module), name)]
    assert not missing, f"flwr {version('flwr')} has no {module}.{missing}"


def test_flowers_internals_are_as_fed_auc_was_written_against():
    changed = []
    for (module, path), (where, how, recorded) in INTERNALS.items():
        name = f"{module}.{path}"
        try:
            now = fingerprint(_resolve(module, path))
        except (ImportError, AttributeError) as exc:
            changed.append(f"flwr {version('flwr')} removed {name} that {where} {how}: {exc}")
            continue
        if now != recorded:
            review = "the patch" if how == PATCHES else "its use"
            changed.append(
                f"flwr {version('flwr')} changed {name} that {where} {how}: review {review}, "
                f"then record fingerprint {now!r} (was {recorded!r})"
            )
    assert not changed, "\n".join(changed)

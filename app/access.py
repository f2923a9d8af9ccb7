"""Who may open the dashboard, with which role, and which runs they see: the access file.

A sign-in through the hospital's OpenID Connect provider says who someone is, never what they
may see; this file does. No Streamlit here, so the rules are tested without a browser.

    max_session_hours = 12           # then sign in again (optional; default 12)

    [[people]]                       # by e-mail (``email``, with ``email_verified = true``)
    email = "ana.lima@north.example"
    role = "clinician"

    [[people]]                       # by any ID-token claim, e.g. a group
    claim = "groups"
    value = "fed-auc-operators"
    role = "operator"

    [[restricted]]                   # a run (or every run of an experiment) only some see,
                                     # with its warm-up, the evaluation jobs that scored its
                                     # model and whatever derives from those
    experiment = "breast-pilot"      # or: run = "<run id>"
    visible_to = [{ email = "ana.lima@north.example" }, { claim = "groups", value = "onco" }]
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

Role = Literal["clinician", "operator"]
ALLOWED_HOSTS_ENV = "FED_AUC_ALLOWED_HOSTS"  # set by ``fed-auc dashboard``: names it answers
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # a rebinding page never has these names
DEFAULT_SESSION_HOURS = 12  # a sign-in older than this is renewed (Streamlit keeps 30 days)
ROLES: tuple[Role, ...] = ("clinician", "operator")  # ascending: an operator sees more
# The pages each role opens: app/pages.py.


class AccessFileError(ValueError):
    """The access file is missing or malformed; the message names the file, entry and field."""


@dataclass(frozen=True)
class Who:
    """One person or group: an e-mail, or an ID-token claim's value (a list claim contains it)."""

    email: str | None = None
    claim: str | None = None
    value: str | None = None

    def matches(self, user: Mapping[str, Any]) -> bool:
        if self.email is not None:
            # An address the provider does not say it verified proves nothing: anyone may
            # register it at a provider that lets users choose their e-mail.
            if user.get("email_verified") is not True:
                return False
            return str(user.get("email", "")).casefold() == self.email.casefold()
        held = user.get(str(self.claim))
        if isinstance(held, list | tuple):
            return self.value in [str(v) for v in held]
        return held is not None and str(held) == self.value

    def describe(self) -> str:
        return self.email if self.email is not None else f"{self.claim}={self.value}"


@dataclass(frozen=True)
class Grant:
    who: Who
    role: Role


@dataclass(frozen=True)
class Restriction:
    """A run id or an experiment name that only ``visible_to`` (and nobody else) sees."""

    run: str | None
    experiment: str | None
    visible_to: tuple[Who, ...]

    def covers(self, run_id: str, config: Mapping[str, Any] | None) -> bool:
        if self.run is not None:
            return run_id == self.run
        return (config or {}).get("experiment") == self.experiment


@dataclass(frozen=True)
class Access:
    grants: tuple[Grant, ...]
    restrictions: tuple[Restriction, ...]
    max_session_s: float = DEFAULT_SESSION_HOURS * 3600

    def role_of(self, user: Mapping[str, Any]) -> Role | None:
        """The highest role any matching entry gives, or None: signed in but not allowed."""
        roles = [g.role for g in self.grants if g.who.matches(user)]
        return max(roles, key=ROLES.index) if roles else None

    def sees_run(
        self,
        user: Mapping[str, Any],
        run_id: str,
        config: Mapping[str, Any] | None,
        sources: Mapping[str, Mapping[str, Any] | None] | None = None,
    ) -> bool:
        """A run no restriction covers is visible to everyone allowed in; one that some
        restrictions cover, only to the people every one of them names. ``sources``: the runs
        it derives from (``lineage``) with their configs, whose restrictions cover it too."""
        runs = {**(sources or {}), run_id: config}
        covering = [r for r in self.restrictions if any(r.covers(i, c) for i, c in runs.items())]
        return all(any(w.matches(user) for w in r.visible_to) for r in covering)


def lineage(run_id: str, derived_from: Mapping[str, Iterable[str]]) -> set[str]:
    """Every run ``run_id`` derives from, directly or through others (``derived_from``: per
    run, the runs it derives from directly), itself excluded; cycles end the walk."""
    found: set[str] = set()
    todo = list(derived_from.get(run_id, ()))
    while todo:
        source = todo.pop()
        if source not in found and source != run_id:
            found.add(source)
            todo.extend(derived_from.get(source, ()))
    return found


def load(path: str | Path) -> Access:
    """Read and check an access file; AccessFileError names what is wrong and where."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AccessFileError(f"access file {path}: not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise AccessFileError(f"access file {path}: {e}") from None
    unknown = set(data) - {"people", "restricted", "max_session_hours"}
    if unknown:
        raise AccessFileError(
            f"access file {path}: unknown key(s) {sorted(unknown)}; "
            "expected [[people]], [[restricted]] and max_session_hours"
        )
    hours = data.get("max_session_hours", DEFAULT_SESSION_HOURS)
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not hours > 0:
        raise AccessFileError(
            f"access file {path}: max_session_hours must be a positive number, not {hours!r}"
        )
    people = _tables(path, data, "people")
    if not people:
        raise AccessFileError(f"access file {path}: no [[people]] entry, so nobody could sign in")
    grants = tuple(_grant(path, i, entry) for i, entry in enumerate(people))
    restrictions = tuple(
        _restriction(path, i, entry) for i, entry in enumerate(_tables(path, data, "restricted"))
    )
    return Access(grants, restrictions, float(hours) * 3600)


def _tables(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise AccessFileError(f"access file {path}: {key} must be an array of tables [[{key}]]")
    return value


def _who(where: str, entry: dict[str, Any], extra: set[str]) -> Who:
    unknown = set(entry) - {"email", "claim", "value"} - extra
    if unknown:
        raise AccessFileError(f"{where}: unknown field(s) {sorted(unknown)}")
    for key in ("email", "claim", "value"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
            raise AccessFileError(f"{where}: {key} must be a non-empty string, not {entry[key]!r}")
    if "email" in entry and ("claim" in entry or "value" in entry):
        raise AccessFileError(f"{where}: give either email or claim + value, not both")
    if "email" in entry:
        if "@" not in entry["email"]:
            raise AccessFileError(f"{where}: email {entry['email']!r} is not an e-mail address")
        return Who(email=entry["email"].strip())
    if "claim" not in entry or "value" not in entry:
        raise AccessFileError(f"{where}: needs email, or claim and value")
    return Who(claim=entry["claim"], value=entry["value"])


def _grant(path: Path, i: int, entry: dict[str, Any]) -> Grant:
    where = f"access file {path}, [[people]] entry {i + 1}"
    who = _who(where, entry, {"role"})
    role = entry.get("role")
    if role not in ROLES:
        raise AccessFileError(f"{where}: role must be one of {list(ROLES)}, not {role!r}")
    return Grant(who, role)


def _restriction(path: Path, i: int, entry: dict[str, Any]) -> Restriction:
    where = f"access file {path}, [[restricted]] entry {i + 1}"
    unknown = set(entry) - {"run", "experiment", "visible_to"}
    if unknown:
        raise AccessFileError(f"{where}: unknown field(s) {sorted(unknown)}")
    if ("run" in entry) == ("experiment" in entry):
        raise AccessFileError(f"{where}: give exactly one of run or experiment")
    for key in ("run", "experiment"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            raise AccessFileError(f"{where}: {key} must be a non-empty string, not {entry[key]!r}")
    visible = entry.get("visible_to")
    tables = isinstance(visible, list) and all(isinstance(v, dict) for v in visible)
    if not tables or not visible:
        raise AccessFileError(
            f"{where}: visible_to must be a non-empty list of {{ email = ... }} or "
            "{ claim = ..., value = ... } tables"
        )
    who = tuple(_who(f"{where}, visible_to[{j}]", v, set()) for j, v in enumerate(visible))
    return Restriction(entry.get("run"), entry.get("experiment"), who)


def host_allowed(host: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request's Host header names a host the dashboard was started for (its port
    ignored; ``*.north.example`` matches subdomains). A DNS-rebinding page reaches 127.0.0.1
    under a name of its own, which this refuses; a request without a Host is refused too."""
    try:
        parsed = urlparse(f"//{host}") if host else None
        name = parsed.hostname if parsed else None
        _ = parsed.port if parsed else None  # a port that is not a number: refused
    except ValueError:
        return False
    if not name or parsed.username or parsed.password or parsed.path:
        return False
    name = name.rstrip(".")
    for pattern in (p.strip().lower().rstrip(".") for p in allowed):
        if name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


def is_loopback(host: str | None) -> bool:
    """Whether only this machine reaches ``host`` (None or "": every interface, Streamlit's
    default)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere

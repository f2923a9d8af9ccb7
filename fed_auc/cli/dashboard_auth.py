"""``fed-auc dashboard``'s settings: flags over a TOML config file, the bind rule (loopback
unless sign-in is on or ``--insecure-public`` says otherwise), the host names it answers
(loopback's, and those it is served under: DNS rebinding gets nothing), and for ``--auth oidc``
the per-launch Streamlit secrets file that holds the provider and the cookie secret.

    # dashboard.toml
    runs_dir = "runs"
    host = "0.0.0.0"
    port = 8501
    auth = "oidc"
    access_file = "dashboard-access.toml"
    audit_log = "/var/log/fed-auc/dashboard-audit.log"
    allowed_hosts = ["fed-auc.north.example"]   # the redirect_uri's host is added anyway

    [oidc]
    server_metadata_url = "https://login.north.example/realms/north/.well-known/openid-configuration"
    client_id = "fed-auc-dashboard"
    client_secret_file = "/etc/fed-auc/oidc-client-secret"   # or env FED_AUC_OIDC_CLIENT_SECRET
    redirect_uri = "https://fed-auc.north.example/oauth2callback"
    cookie_secret_file = "/etc/fed-auc/cookie-secret"        # or env; else one per launch
    scope = "openid email profile"
"""

from __future__ import annotations

import os
import secrets
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

CLIENT_SECRET_ENV = "FED_AUC_OIDC_CLIENT_SECRET"
COOKIE_SECRET_ENV = "FED_AUC_COOKIE_SECRET"
TYPES = {
    "runs_dir": str, "port": int, "host": str, "auth": str, "access_file": str,
    "audit_log": str, "insecure_public": bool, "allowed_hosts": list, "oidc": dict,
}  # fmt: skip
OIDC_KEYS = {
    "server_metadata_url", "client_id", "client_secret_file", "redirect_uri",
    "cookie_secret_file", "scope",
}  # fmt: skip
OIDC_REQUIRED = ("server_metadata_url", "client_id", "redirect_uri")
OPEN_ENDPOINTS = (
    "/_stcore/health (that it runs), /_stcore/host-config (Streamlit's allowed origins), "
    "/_stcore/metrics (session counts and durations, cache sizes) and the page shell (the "
    "same HTML and JavaScript for everyone); no run, site or figure"
)


@dataclass
class Settings:
    runs_dir: str = "runs"
    port: int = 8501
    host: str = "127.0.0.1"
    auth: str = "none"
    access_file: str | None = None
    audit_log: str = "dashboard-audit.log"
    insecure_public: bool = False
    allowed_hosts: list[str] = field(default_factory=list)
    oidc: dict[str, Any] = field(default_factory=dict)

    def hosts(self) -> list[str]:
        """The Host header names the dashboard answers: loopback's, the address it binds (a
        name or a single address), the sign-in redirect's host and ``allowed_hosts``."""
        from app.access import LOOPBACK_NAMES

        names = [*LOOPBACK_NAMES, *self.allowed_hosts]
        if self.host and self.host not in ("0.0.0.0", "::"):
            names.append(self.host)
        if self.oidc.get("redirect_uri"):
            names.append(urlparse(self.oidc["redirect_uri"]).hostname or "")
        return list(dict.fromkeys(n.lower() for n in names if n))


def settings(args: Any) -> Settings:
    """Defaults, then ``--config``'s keys, then the flags given; checked."""
    from app.access import is_loopback  # the app's own rule, which it holds to when run by hand

    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(_read(Path(args.config)))
    for key in set(TYPES) - {"oidc"}:
        given = getattr(args, key, None)
        if given not in (None, False):
            values[key] = given
    where = f"fed-auc dashboard{f' (config {args.config})' if args.config else ''}"
    for key, value in values.items():
        expected = TYPES[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise SystemExit(f"{where}: {key} must be {expected.__name__}, not {value!r}")
    for host in values.get("allowed_hosts", []):
        if not isinstance(host, str) or not host.strip(".*") or host == "*" or "/" in host:
            raise SystemExit(
                f"{where}: allowed host {host!r} must be a host name (e.g. dash.north.example, "
                "*.north.example), never '*': that would answer DNS-rebinding pages"
            )
    for key, value in values.get("oidc", {}).items():
        if not isinstance(value, str) or not value:
            raise SystemExit(f"{where}: [oidc] {key} must be a non-empty string, not {value!r}")
    result = Settings(**values)
    if result.auth not in ("none", "oidc"):
        raise SystemExit(f"{where}: auth must be 'none' or 'oidc', not {result.auth!r}")
    if result.auth == "oidc":
        if not result.access_file:
            raise SystemExit(f"{where}: --auth oidc needs an access file (--access-file)")
        missing = [k for k in OIDC_REQUIRED if not result.oidc.get(k)]
        if missing:
            raise SystemExit(f"{where}: --auth oidc needs [oidc] {', '.join(missing)} (--config)")
    elif not is_loopback(result.host) and not result.insecure_public:
        raise SystemExit(
            f"{where}: refusing to serve the dashboard on {result.host} without sign-in: anyone "
            "who reaches that address would see every run. Use --auth oidc (see hospitals/"
            "README.md, 'Who can open the dashboard'), keep the default 127.0.0.1, or pass "
            "--insecure-public if a proxy in front of it signs people in."
        )
    elif not is_loopback(result.host) and not result.allowed_hosts:
        raise SystemExit(
            f"{where}: --insecure-public on {result.host} needs --allowed-host NAME, the host "
            "name the signing-in proxy uses: any other name is refused (DNS rebinding)"
        )
    return result


def _read(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"fed-auc dashboard: config {path}: {e}") from None
    unknown = set(data) - set(TYPES)
    if unknown:
        raise SystemExit(
            f"fed-auc dashboard: config {path}: unknown key(s) {sorted(unknown)}; "
            f"known: {sorted(TYPES)}"
        )
    oidc = data.get("oidc", {})
    if not isinstance(oidc, dict) or set(oidc) - OIDC_KEYS:
        raise SystemExit(
            f"fed-auc dashboard: config {path}: [oidc] takes only {sorted(OIDC_KEYS)}, "
            f"not {sorted(set(oidc) - OIDC_KEYS) if isinstance(oidc, dict) else oidc!r}"
        )
    return data


def _secret(oidc: dict[str, Any], file_key: str, env: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    if oidc.get(file_key):
        try:
            return Path(oidc[file_key]).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SystemExit(f"fed-auc dashboard: [oidc] {file_key}: {e}") from None
    return None


def write_secrets(oidc: dict[str, Any]) -> Path:
    """A private directory holding ``secrets.toml`` with Streamlit's ``[auth]`` section, for
    this launch only (the caller removes it). Without an operator's cookie secret one is
    drawn with ``secrets``: sign-ins then last until the dashboard restarts."""
    import tomli_w

    client_secret = _secret(oidc, "client_secret_file", CLIENT_SECRET_ENV)
    if not client_secret:
        raise SystemExit(
            f"fed-auc dashboard: --auth oidc needs the client secret: [oidc] client_secret_file "
            f"or the environment variable {CLIENT_SECRET_ENV}"
        )
    cookie = _secret(oidc, "cookie_secret_file", COOKIE_SECRET_ENV) or secrets.token_urlsafe(32)
    auth = {
        "redirect_uri": oidc["redirect_uri"],
        "cookie_secret": cookie,
        "client_id": oidc["client_id"],
        "client_secret": client_secret,
        "server_metadata_url": oidc["server_metadata_url"],
        "client_kwargs": {"scope": oidc.get("scope", "openid email profile")},
    }
    directory = Path(tempfile.mkdtemp(prefix="fed-auc-dashboard-"))  # mode 0700
    path = directory / "secrets.toml"
    path.touch(mode=0o600)
    path.write_text(tomli_w.dumps({"auth": auth}), encoding="utf-8")
    return directory

"""The dashboard against those who ask cleverly, without a browser: a web page that points its
own host name at 127.0.0.1 (DNS rebinding), an environment that turns on Streamlit settings
deciding identity, a clinician kept off a run who opens what derives from it, a provider's
unverified e-mail, and a local user reading the audit log. Each attack must fail."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from streamlit.runtime.context import ContextProxy
from streamlit.testing.v1 import AppTest

from app import access, audit
from app.access import ALLOWED_HOSTS_ENV, host_allowed
from app.common import RUNS_DIR_ENV
from app.gate import ACCESS_FILE_ENV
from fed_auc.store.run_store import RunStore
from tests.dashboard.test_dashboard_access import _settings
from tests.support.apptest import APP, texts
from tests.support.dashboard_store import fill, fill_evaluation_job, fill_warmup

RUN_IDS = ("run-complete", "run-other", "run-one", "run-failed", "run-live")
ACCESS = """
[[people]]
email = "ana@north.example"
role = "clinician"

[[people]]
claim = "groups"
value = "onco"
role = "operator"

[[restricted]]
run = "run-main"
visible_to = [{ claim = "groups", value = "onco" }]
"""
ANA = {"email": "ana@north.example", "email_verified": True}
OLU = {"email": "olu@north.example", "groups": ["onco"]}


def _with_host(monkeypatch, host: str) -> None:
    """The request headers a browser sends: the Host it put in the address bar."""
    monkeypatch.setattr(ContextProxy, "headers", property(lambda self: {"Host": host}))


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


@pytest.mark.parametrize("host", ["rebind.attacker.example:8501", "127.0.0.1.nip.io", ""])
def test_a_page_under_a_foreign_host_name_gets_no_run(monkeypatch, store_dir, host):
    """DNS rebinding: the attacker's name resolves to 127.0.0.1; the browser sends it as Host."""
    monkeypatch.setenv(RUNS_DIR_ENV, str(store_dir))
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    _with_host(monkeypatch, host)
    at = AppTest.from_file(APP, default_timeout=60).run()
    shown = texts(at) + "\n".join(str(t.value) for t in at.title)
    assert "does not answer the host name" in shown
    assert not at.sidebar.selectbox and not at.dataframe
    assert not any(run in shown for run in RUN_IDS)


@pytest.mark.parametrize(
    ("host", "names"),
    [("127.0.0.1:8501", None), ("localhost", None), ("dash.north.example", "dash.north.example")],
)
def test_the_hosts_it_was_started_for_are_answered(monkeypatch, store_dir, host, names):
    monkeypatch.setenv(RUNS_DIR_ENV, str(store_dir))
    if names is None:
        monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    else:
        monkeypatch.setenv(ALLOWED_HOSTS_ENV, names)  # fed-auc dashboard --allowed-host
    _with_host(monkeypatch, host)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and at.sidebar.selectbox(key="run_id").options


def test_host_names_match_as_streamlit_matches_them():
    allowed = ["localhost", "127.0.0.1", "::1", "dash.north.example", "*.lab.north.example"]
    for host in ("localhost:8501", "[::1]:8501", "DASH.north.example.", "a.lab.north.example"):
        assert host_allowed(host, allowed), host
    for host in (
        None, "", "evil.example", "dash.north.example.evil.example", "lab.north.example.x",
        "user@localhost", "localhost:notaport", "localhost/x", "127.0.0.2",
    ):  # fmt: skip
        assert not host_allowed(host, allowed), host


def test_the_command_answers_only_the_names_it_was_given(tmp_path):
    assert _settings().hosts() == ["localhost", "127.0.0.1", "::1"]
    named = _settings("--host", "0.0.0.0", "--insecure-public", "--allowed-host", "Dash.example")
    assert named.hosts() == ["localhost", "127.0.0.1", "::1", "dash.example"]
    for wildcard in ("*", "*.", "a/b"):
        with pytest.raises(SystemExit, match="must be a host name"):
            _settings("--allowed-host", wildcard)
    config = tmp_path / "dashboard.toml"
    config.write_text(
        f'auth = "oidc"\naccess_file = "{tmp_path / "a.toml"}"\nallowed_hosts = ["alias.example"]'
        '\n[oidc]\nclient_id = "d"\nserver_metadata_url = "https://idp.example/.well-known/x"\n'
        'redirect_uri = "https://fed-auc.north.example/oauth2callback"\n'
    )
    assert _settings("--config", str(config)).hosts()[-2:] == [
        "alias.example", "fed-auc.north.example"  # the sign-in redirect's host
    ]  # fmt: skip


def test_the_environment_cannot_change_who_the_dashboard_thinks_someone_is(tmp_path, monkeypatch):
    """STREAMLIT_* variables, ~/.streamlit and ./.streamlit that turn on trusted user headers,
    the agent API, a wildcard host list, no XSRF, no CORS: none reaches Streamlit."""
    from fed_auc.cli import dashboard_process

    hostile = {
        "STREAMLIT_SERVER_TRUSTED_USER_HEADERS": '{"X-Email": "email"}',
        "STREAMLIT_SERVER_ENABLE_AGENT_API": "true",
        "STREAMLIT_SERVER_ALLOWED_HOSTS": "*",
        "STREAMLIT_SERVER_ENABLE_XSRF_PROTECTION": "false",
        "streamlit_server_enable_cors": "false",
    }
    for name, value in hostile.items():
        monkeypatch.setenv(name, value)
    for folder in (tmp_path / "home", tmp_path / "cwd"):
        (folder / ".streamlit").mkdir(parents=True)
        (folder / ".streamlit" / "config.toml").write_text(
            '[server]\ntrustedUserHeaders = {"X-Email" = "email"}\nenableAgentApi = true\n'
        )
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "cwd")
    seen = {}

    def serve(command, env, cwd):
        home = Path(env["HOME"])
        seen.update(command=command, env=env, cwd=cwd, files=sorted(home.rglob("*")))
        seen.update(mode=oct(stat.S_IMODE(home.parent.stat().st_mode)), inside=cwd.parent)
        return 0

    monkeypatch.setattr(dashboard_process, "_serve", serve)
    assert dashboard_process.dashboard(_settings("--runs-dir", str(tmp_path / "runs"))) == 0
    env, command = seen["env"], seen["command"]
    assert not [k for k in env if k.upper().startswith("STREAMLIT_")]
    assert Path(env["HOME"]) != tmp_path / "home" and seen["files"] == []  # nothing of the caller's
    assert seen["cwd"] != tmp_path / "cwd" and seen["mode"] == "0o700"
    assert seen["inside"] == Path(env["HOME"]).parent  # both in this launch's private folder
    assert not Path(env["HOME"]).exists()  # removed when the command ends
    flags = {command[i]: command[i + 1] for i in range(len(command) - 1)}
    assert flags["--server.trustedUserHeaders"] == "{}"
    assert flags["--server.enableAgentApi"] == "false"
    assert flags["--server.enableXsrfProtection"] == "true"
    assert flags["--server.enableCORS"] == "true"
    hosts = [command[i + 1] for i, f in enumerate(command) if f == "--server.allowedHosts"]
    assert hosts == ["localhost", "127.0.0.1", "::1"] == env[ALLOWED_HOSTS_ENV].split(",")


@pytest.fixture
def derived_store(tmp_path):
    """run-main (restricted), its warm-up, an evaluation job that scored its model, a run
    started from the warm-up's export (derived through it), and an unrelated run."""
    runs = tmp_path / "runs"
    warm, main = fill_warmup(runs, warm_rounds=2, rounds=3)
    job = fill_evaluation_job(runs, main)
    with RunStore(runs) as store:
        tuned = store.create_run(
            "codasca", {"rounds": 1, "init": str(runs / warm / "model.pt")}, run_id="run-tuned"
        )
        store.create_run("codasca", {"rounds": 1}, run_id="run-free")
    return runs, {"warm": warm, "main": main, "job": job, "tuned": tuned}


def _open(monkeypatch, tmp_path, runs, claims) -> AppTest:
    (tmp_path / "access.toml").write_text(ACCESS)
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    monkeypatch.setenv(ACCESS_FILE_ENV, str(tmp_path / "access.toml"))
    monkeypatch.setenv(audit.AUDIT_LOG_ENV, str(tmp_path / "audit.log"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.user = {**claims, "is_logged_in": True, "iat": int(time.time())}
    return at.run()


def test_a_restriction_covers_the_warm_up_evaluation_jobs_and_runs_derived(
    monkeypatch, tmp_path, derived_store
):
    runs, ids = derived_store
    ana = _open(monkeypatch, tmp_path, runs, ANA)
    options = " ".join(str(o) for o in ana.sidebar.selectbox(key="run_id").options)
    assert "run-free" in options
    for run in ids.values():
        assert run not in options, run
    for page in ("overview", "sites", "roc", "operating_point", "evaluations"):
        ana.switch_page(f"views/{page}.py").run()
        shown = texts(ana) + " ".join(str(o) for s in ana.selectbox for o in s.options)
        assert not any(run in shown for run in ids.values()), page
    olu = _open(monkeypatch, tmp_path, runs, OLU)
    options = " ".join(str(o) for o in olu.sidebar.selectbox(key="run_id").options)
    assert all(run in options for run in ids.values())


def test_lineage_follows_derivations_and_stops_at_cycles():
    derived = {"job": ["tuned"], "tuned": ["warm"], "warm": ["main"], "a": ["b"], "b": ["a"]}
    assert access.lineage("job", derived) == {"tuned", "warm", "main"}
    assert access.lineage("a", derived) == {"b"}
    assert access.lineage("main", derived) == set()


def test_an_e_mail_grant_needs_an_e_mail_the_provider_verified(tmp_path):
    (tmp_path / "access.toml").write_text(ACCESS)
    rules = access.load(tmp_path / "access.toml")
    assert rules.role_of(ANA) == "clinician"
    for verified in (None, False, "false", "true"):  # missing, refused, or not a boolean
        claims = {"email": ANA["email"]} | (
            {} if verified is None else {"email_verified": verified}
        )
        assert rules.role_of(claims) is None, verified
    assert rules.role_of({"groups": ["onco"]}) == "operator"  # claim grants need no e-mail


def test_the_audit_log_names_the_run_viewed_and_the_client_and_is_private(
    monkeypatch, tmp_path, derived_store
):
    runs, _ = derived_store
    os.umask(0o022)  # a typical umask: new files readable by all unless the log says otherwise
    olu = _open(monkeypatch, tmp_path, runs, OLU)
    olu.sidebar.selectbox(key="run_id").select("run-free").run()
    olu.switch_page("views/roc.py").run()
    views = [(e["page"], e["run"], e["client"]) for e in audit.read(tmp_path / "audit.log")
             if e["event"] == "view"]  # fmt: skip
    assert views[-2:] == [("overview", "run-free", "local"), ("roc", "run-free", "local")]
    assert stat.S_IMODE((tmp_path / "audit.log").stat().st_mode) == 0o600


def test_audit_files_stay_private_across_rotation_and_a_wide_file_is_narrowed(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(audit, "MAX_BYTES", 600)
    os.umask(0o022)
    log = tmp_path / "logs" / "audit.log"
    log.parent.mkdir()
    log.write_text("")
    log.chmod(0o644)  # left readable by someone before
    for i in range(20):
        audit.record(log, "view", f"u{i}@north.example", "clinician", "roc", "run-a", "10.0.0.9")
    files = sorted(tmp_path.glob("logs/audit.log*"))
    assert len(files) > 1
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}
    assert audit.read(log)[-1]["client"] == "10.0.0.9"

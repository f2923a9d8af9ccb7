"""Who may open the dashboard, without a browser: the access file's rules and errors, every page
under AppTest for each role (``st.user`` seeded as a signed-in user), per-run visibility, the
audit log, and ``fed-auc dashboard``'s loopback rule."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest
from streamlit.testing.v1 import AppTest

from app import access, audit
from app.access import AccessFileError
from app.common import RUNS_DIR_ENV
from app.gate import ACCESS_FILE_ENV, INSECURE_PUBLIC_ENV
from app.pages import PAGES
from fed_auc.cli.dashboard_process import add_dashboard_parser
from tests.support.apptest import APP, streamlit_option, texts
from tests.support.dashboard_store import fill
from tests.support.paths import ROOT

ACCESS = """
[[people]]
email = "Ana@North.example"
role = "clinician"

[[people]]
claim = "groups"
value = "fed-auc-operators"
role = "operator"

[[people]]
email = "kim@north.example"
role = "operator"

[[restricted]]
run = "run-other"
visible_to = [{ claim = "groups", value = "fed-auc-operators" }]
"""
ANA = {"email": "ana@north.example", "email_verified": True}
OLU = {"email": "olu@north.example", "groups": ["fed-auc-operators", "staff"]}
KIM = {"email": "kim@north.example", "email_verified": True}
HEADINGS = {p.key: p.shown_heading for p in PAGES}
CLINICIAN = {"overview", "sites", "roc", "operating_point", "evaluations"}
RUN_IDS = ("run-complete", "run-other", "run-one", "run-failed", "run-live")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


@pytest.fixture
def signed_in(monkeypatch, store_dir, tmp_path):
    """An AppTest factory for a user signed in now (or ``iat`` seconds ago); the audit log."""
    (tmp_path / "access.toml").write_text(ACCESS)
    log = tmp_path / "audit.log"
    monkeypatch.setenv(RUNS_DIR_ENV, str(store_dir))
    monkeypatch.setenv(ACCESS_FILE_ENV, str(tmp_path / "access.toml"))
    monkeypatch.setenv(audit.AUDIT_LOG_ENV, str(log))

    def open_as(claims: dict | None, age_s: float = 0.0) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60)
        at.user = (
            {"is_logged_in": False}
            if claims is None
            else {**claims, "is_logged_in": True, "iat": int(time.time() - age_s)}
        )
        return at.run()

    return open_as, log


def _write(tmp_path, text: str):
    path = tmp_path / "access.toml"
    path.write_text(text)
    return path


def test_the_access_file_gives_roles_by_email_or_claim_and_hides_restricted_runs(tmp_path):
    rules = access.load(_write(tmp_path, ACCESS))
    assert rules.role_of(ANA) == "clinician"  # e-mail compared without case
    assert rules.role_of(OLU) == "operator"  # a group in a list claim
    assert rules.role_of({"email": "eve@north.example"}) is None
    assert rules.role_of({**ANA, "email_verified": False}) is None  # unverified proves nothing
    assert rules.role_of({**ANA, "groups": "fed-auc-operators"}) == "operator"  # the highest
    assert not rules.sees_run(ANA, "run-other", {})
    assert rules.sees_run(OLU, "run-other", {})
    assert not rules.sees_run(KIM, "run-other", {})  # an operator, but not in the group
    assert rules.sees_run(ANA, "run-complete", {})
    by_experiment = access.load(
        _write(
            tmp_path,
            "max_session_hours = 2\n" + ACCESS.replace('run = "run-other"', 'experiment = "onco"'),
        )
    )
    assert not by_experiment.sees_run(ANA, "any", {"experiment": "onco"})
    assert by_experiment.sees_run(ANA, "any", {"experiment": "cardio"})
    assert by_experiment.max_session_s == 7200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no [[people]] entry"),
        ("[[people]]\nemail = 'a@b'\nrole = 'admin'\n", "entry 1: role must be one of"),
        ("[[people]]\nrole = 'clinician'\n", "entry 1: needs email, or claim and value"),
        ("[[people]]\nemail = 'nobody'\nrole = 'operator'\n", "'nobody' is not an e-mail"),
        ("[[people]]\nclaim = 'groups'\nvalue = ''\nrole = 'operator'\n", "value must be a"),
        ("[[people]]\nemail = 'a@b'\nrole = 'operator'\ngroup = 'x'\n", "unknown field(s) ['g"),
        ("[[people]]\nemail = 'a@b'\nrole = 'operator'\n[[restricted]]\nrun = 'r'\n", "visible_to"),
        ("[[people]]\nemail = 'a@b'\nrole = 'operator'\n[[restricted]]\nvisible_to = "
         "[{ email = 'a@b' }]\n", "exactly one of run or experiment"),
        ("[users]\n", "unknown key(s) ['users']"),
        ("max_session_hours = 0\n[[people]]\nemail = 'a@b'\nrole = 'operator'\n", "positive"),
        ("[[people]\n", "access file"),
    ],
)  # fmt: skip
def test_a_bad_access_file_is_refused_naming_the_file_entry_and_field(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(AccessFileError, match=str(path)) as error:
        access.load(path)
    assert message in str(error.value)


def _page(at: AppTest, key: str) -> AppTest:
    return at.switch_page(f"views/{key}.py").run()


@pytest.mark.parametrize(("who", "allowed"), [(ANA, CLINICIAN), (OLU, set(HEADINGS))])
def test_each_role_opens_its_pages_and_no_other(signed_in, who, allowed):
    open_as, log = signed_in
    at = open_as(who)
    for key, title in HEADINGS.items():
        if key not in allowed:  # not among the pages this session's navigation registered
            with pytest.raises(ValueError, match="Could not find a navigation page"):
                _page(at, key)
            continue
        _page(at, key)
        assert not at.exception, (key, [e.value for e in at.exception])
        assert [t.value for t in at.title] == [title], key
    role = "clinician" if who is ANA else "operator"
    assert f"Signed in as {who['email']} ({role})" in texts(at)
    events = [e for e in audit.read(log) if e["event"] != "view"]
    assert [(e["event"], e["user"], e["role"]) for e in events] == [
        ("sign-in", who["email"], role)  # once per sign-in, not per page
    ]


def _offers(widget, run_id: str) -> bool:
    """Whether a picker offers the run (its options are labels ending in the run's id)."""
    return any(str(option).endswith(run_id) for option in widget.options)


def test_a_restricted_run_is_in_no_list_for_those_it_is_not_shown_to(signed_in):
    open_as, _ = signed_in
    ana = open_as(ANA)
    assert _offers(ana.sidebar.selectbox(key="run_id"), "run-complete")
    assert not _offers(ana.sidebar.selectbox(key="run_id"), "run-other")
    all_runs = ana.dataframe[-1].value["id"].tolist()  # Overview's "All runs"
    assert "run-complete" in all_runs and "run-other" not in all_runs
    assert _offers(open_as(OLU).sidebar.selectbox(key="run_id"), "run-other")
    kim = _page(open_as(KIM), "compare")  # an operator outside the group
    assert _offers(kim.multiselect[0], "run-complete")
    assert not _offers(kim.multiselect[0], "run-other")


@pytest.mark.parametrize(
    ("claims", "age_s", "event", "message"),
    [
        ({"email": "eve@north.example"}, 0, "refused", "not allowed to open this dashboard"),
        ({**ANA, "email_verified": False}, 0, "refused", "not allowed"),
        (ANA, 13 * 3600, "expired", "Your sign-in has expired"),
    ],
)
def test_someone_not_admitted_sees_the_refusal_and_nothing_of_the_store(
    signed_in, claims, age_s, event, message
):
    open_as, log = signed_in
    at = open_as(claims, age_s)
    shown = texts(at)
    assert message in shown and f"Signed in as {claims['email']}" in shown
    assert not at.sidebar.selectbox and not at.dataframe and not at.metric
    assert not any(run in shown for run in RUN_IDS)
    assert [b.label for b in at.button] == ["Sign out"]
    assert [(e["event"], e["user"], e["role"]) for e in audit.read(log)] == [
        (event, claims["email"], None)
    ]


def test_signed_out_visitors_get_the_sign_in_button_only(signed_in):
    open_as, log = signed_in
    at = open_as(None)
    assert [b.label for b in at.button] == ["Sign in"]
    assert not at.sidebar.selectbox and not at.dataframe
    assert not any(run in texts(at) for run in RUN_IDS)
    assert audit.read(log) == []


def test_signing_out_is_audited(signed_in):
    open_as, log = signed_in
    at = open_as(ANA)
    at.sidebar.button[0].click().run()
    assert [e["event"] for e in audit.read(log)] == ["sign-in", "view", "sign-out"]
    assert audit.read(log)[-1]["role"] == "clinician"


def test_the_audit_log_rotates(tmp_path, monkeypatch):
    monkeypatch.setattr(audit, "MAX_BYTES", 2000)
    log = tmp_path / "rotating.log"
    for i in range(60):
        audit.record(log, "sign-in", f"user{i}@north.example", "clinician", "overview")
    rotated = sorted(p.name for p in tmp_path.glob("rotating.log.*"))
    assert rotated and log.stat().st_size <= 2000
    lines = [x for p in tmp_path.glob("rotating.log*") for x in p.read_text().splitlines()]
    assert sorted(json.loads(x)["user"] for x in lines) == sorted(
        f"user{i}@north.example" for i in range(60)
    )


def _settings(*argv: str):
    from fed_auc.cli.dashboard_auth import settings

    parser = argparse.ArgumentParser()
    add_dashboard_parser(parser.add_subparsers())
    return settings(parser.parse_args(["dashboard", *argv]))


def test_without_sign_in_the_dashboard_binds_to_loopback_only(capsys):
    assert _settings().host == "127.0.0.1"
    assert _settings("--host", "::1").host == "::1"
    for host in ("0.0.0.0", "10.1.2.3", "dashboard.north.example"):
        with pytest.raises(SystemExit, match=f"refusing to serve the dashboard on {host} wit"):
            _settings("--host", host)
    with pytest.raises(SystemExit, match="--insecure-public on 0.0.0.0 needs --allowed-host"):
        _settings("--host", "0.0.0.0", "--insecure-public")  # would answer any host name
    assert _settings(
        "--host", "0.0.0.0", "--insecure-public", "--allowed-host", "dash.north.example"
    ).insecure_public  # fmt: skip


def test_insecure_public_warns_and_the_start_says_it_is_unauthenticated(monkeypatch, capsys):
    from fed_auc.cli import dashboard_process

    served = {}
    monkeypatch.setattr(
        dashboard_process, "_serve", lambda command, env, cwd: served.update(env) or 0
    )
    monkeypatch.setenv(INSECURE_PUBLIC_ENV, "1")  # from the caller's shell: never passed on
    assert dashboard_process.dashboard(_settings("--host", "127.0.0.1")) == 0
    assert INSECURE_PUBLIC_ENV not in served
    public = ("--host", "0.0.0.0", "--insecure-public", "--allowed-host", "dash.north.example")
    assert dashboard_process.dashboard(_settings(*public)) == 0
    assert served[INSECURE_PUBLIC_ENV] == "1"  # the app serves the address the operator chose
    err = capsys.readouterr().err
    assert "WARNING: serving 0.0.0.0 without sign-in (--insecure-public)" in err
    assert "UNAUTHENTICATED" in err and "/_stcore/metrics" in err


@pytest.mark.parametrize("address", [None, "0.0.0.0", "10.1.2.3"])
def test_streamlit_run_by_hand_on_an_open_address_shows_nothing_of_the_store(
    monkeypatch, store_dir, address
):
    """``streamlit run app/streamlit_app.py`` without fed-auc's launcher listens on every
    interface: the app itself refuses to serve the store there without sign-in."""
    monkeypatch.setenv(RUNS_DIR_ENV, str(store_dir))
    monkeypatch.delenv(INSECURE_PUBLIC_ENV, raising=False)
    with streamlit_option("server.address", address):
        at = AppTest.from_file(APP, default_timeout=60).run()
        shown = "\n".join(str(e.value) for e in [*at.title, *at.error, *at.markdown])
        assert not at.exception, [e.value for e in at.exception]
        assert "no sign-in and listens on" in shown and "--server.address 127.0.0.1" in shown
        assert not at.sidebar.selectbox and all(r not in shown for r in RUN_IDS)
        monkeypatch.setenv(INSECURE_PUBLIC_ENV, "1")  # fed-auc dashboard --insecure-public
        opened = AppTest.from_file(APP, default_timeout=60).run()
        assert not opened.error and opened.sidebar.selectbox(key="run_id").options


def test_sign_in_settings_come_from_the_config_file_and_the_secrets_are_per_launch(
    tmp_path, monkeypatch
):
    from fed_auc.cli import dashboard_process

    (tmp_path / "access.toml").write_text(ACCESS)
    config = tmp_path / "dashboard.toml"
    config.write_text(
        f'host = "0.0.0.0"\nauth = "oidc"\naccess_file = "{tmp_path / "access.toml"}"\n'
        f'audit_log = "{tmp_path / "audit.log"}"\n[oidc]\nclient_id = "dash"\n'
        'server_metadata_url = "https://idp.example/.well-known/openid-configuration"\n'
        'redirect_uri = "https://dash.example/oauth2callback"\n'
    )
    monkeypatch.setenv("FED_AUC_OIDC_CLIENT_SECRET", "s3cret")
    seen = {}

    def serve(command, env, cwd):
        path = command[command.index("--secrets.files") + 1]
        seen.update(path=path, text=open(path).read(), mode=oct(os.stat(path).st_mode))
        return 0

    monkeypatch.setattr(dashboard_process, "_serve", serve)
    for _ in range(2):
        assert dashboard_process.dashboard(_settings("--config", str(config))) == 0
        assert 'client_secret = "s3cret"' in seen["text"] and seen["mode"].endswith("600")
        assert not os.path.exists(seen["path"])  # removed when it ends
        seen.setdefault("cookies", []).append(
            next(x for x in seen["text"].splitlines() if x.startswith("cookie_secret"))
        )
    assert seen["cookies"][0] != seen["cookies"][1]  # drawn per launch without an operator's
    with pytest.raises(SystemExit, match=r"needs \[oidc\] server_metadata_url"):
        config.write_text('auth = "oidc"\naccess_file = "a.toml"\n[oidc]\nclient_id = "x"\n')
        _settings("--config", str(config))
    with pytest.raises(SystemExit, match="needs an access file"):
        _settings("--auth", "oidc")
    config.write_text('auth = "oidc"\nport = 1\nsecret = "x"\n')
    with pytest.raises(SystemExit, match=r"unknown key\(s\) \['secret'\]"):
        _settings("--config", str(config))
    config.write_text('port = "8501"\n')
    with pytest.raises(SystemExit, match=rf"config {config}\): port must be int, not '8501'"):
        _settings("--config", str(config))


def test_the_command_refuses_a_public_bind_without_sign_in_and_says_why(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fed_auc.cli", "dashboard", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    assert "refusing to serve the dashboard on 0.0.0.0 without sign-in" in done.stderr
    assert "--auth oidc" in done.stderr and "--insecure-public" in done.stderr
    assert "http://" not in done.stderr  # no URL printed for a server that never starts


def test_an_experiment_name_is_recorded_with_the_run_for_the_access_file_to_match():
    from fed_auc.cli.experiment_options import add_simulate_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--experiment", "onco-pilot"])
    assert config_from_args(args).to_dict()["experiment"] == "onco-pilot"


def test_an_access_file_broken_while_serving_shuts_everyone_out(signed_in, tmp_path):
    open_as, _ = signed_in
    (tmp_path / "access.toml").write_text('[[people]]\nemail = "x"\nrole = "operator"\n')
    at = open_as(OLU)
    assert "Nobody can open the dashboard until its access file is fixed" in texts(at)
    assert "'x' is not an e-mail address" in texts(at)
    assert not at.exception and not at.sidebar.selectbox and not at.button

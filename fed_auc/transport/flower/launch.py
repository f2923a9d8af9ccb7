"""Starting the Flower processes behind ``fed-auc coordinator`` and ``fed-auc node``.

Coordinator: a SuperLink (TLS, node authentication), the site keys registered through its
Control API, then the fed-auc Flower app submitted with ``flwr run``; the ServerApp runs the
experiment and leaves a summary file. Node: the long-lived node worker in this process, which
also executes the ClientApp tasks, and a SuperNode child (``--isolation process``). Flower's own
CLIs do the work (``flwr``, ``flower-superlink``, ``flower-supernode``); they spawn
``flower-superexec`` by name, so the environment's ``bin`` is put on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fed_auc.experiment.files import FlowerSettings
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import STORE_FILE, RunStore
from fed_auc.transport.flower import client
from fed_auc.transport.flower.coordinator_watch import ProcessIdentity, resume_hint
from fed_auc.transport.flower.executor import serve_tasks
from fed_auc.transport.flower.identity import key_file_fingerprint, read_site_keys
from fed_auc.transport.flower.node_watch import (
    SupernodeWatch,
    lock_state_dir,
    unlock_state_dir,
)
from fed_auc.transport.flower.processes import (
    die_with_parent,
    flower_env,
    follow_log,
    free_port,
    kill_group,
    reachable,
    read_from,
    relay,
    stop_tree,
    wait_for_port,
    wait_or_unstick,
)
from fed_auc.transport.flower.worker import NodeWorker

CONNECTION = "fedauc"
RESTART_DELAY_S = 5.0

APP_PYPROJECT = """\
# Written by fed-auc (flower_launch.write_app): the fed-auc Flower app.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedauc"
version = "0.1.0"
description = "fed-auc: federated deep AUC maximization (coordinator and hospital nodes)"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedauc"

[tool.flwr.app.components]
serverapp = "fedauc_server:server_app"
clientapp = "fedauc_client:app"

[tool.flwr.app.config]
experiment-file = ""
"""

SERVER_MODULE = (
    '"""fed-auc ServerApp (the coordinator): see fed_auc.transport.flower.server."""\n'
    "import fed_auc.transport.flower.server as _server\n\n"
    "server_app = _server.server_app\n"
)


def write_app(app_dir: Path) -> Path:
    """The Flower app: its pyproject, the thin ClientApp (stdlib + Flower) and the ServerApp."""
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(APP_PYPROJECT)
    shutil.copyfile(client.__file__, app_dir / "fedauc_client.py")
    (app_dir / "fedauc_server.py").write_text(SERVER_MODULE)
    return app_dir


# -- coordinator --------------------------------------------------------------------------
def run_coordinator(experiment: dict[str, Any], work_dir: Path, echo=print) -> dict[str, Any]:
    """Start the SuperLink, register the site keys, run the app; return the run summary.

    The run is created in the store here, before anything can fail or be stopped; a run that
    ends without its summary (an error, Ctrl-C, SIGTERM) is marked failed, resumable with
    ``fed-auc coordinator --resume``, never left "running".
    """
    settings = FlowerSettings(**experiment["flower"])
    experiment = {**experiment, "run_id": experiment.get("run_id") or _create_run(experiment)}
    run_id, runs_dir = experiment["run_id"], experiment["experiment"]["runs_dir"]
    echo(f"run {run_id}: store {Path(runs_dir) / STORE_FILE}")
    work_dir = work_dir.resolve()
    summary_file = work_dir / "summary.json"
    summary_file.unlink(missing_ok=True)
    hint = resume_hint(experiment)
    try:
        _serve(experiment, settings, work_dir, summary_file, echo)
    except KeyboardInterrupt as exc:
        _mark_stopped(runs_dir, run_id, exc)
        raise CoordinatorStopped(f"stopped; run {run_id} is marked failed{hint}") from None
    except Exception as exc:
        _mark_stopped(runs_dir, run_id, exc)
        raise CoordinatorFailed(f"run {run_id} failed: {exc}{hint}") from exc
    if not summary_file.exists():
        error = RuntimeError(
            f"the Flower run ended without a result; see {work_dir / 'superlink.log'} "
            "and the run's events in the store"
        )
        _mark_stopped(runs_dir, run_id, error)
        raise CoordinatorFailed(f"run {run_id} failed: {error}{hint}")
    summary = json.loads(summary_file.read_text())
    if "error" in summary:  # the ServerApp's failure, recorded in the store already
        _mark_stopped(runs_dir, run_id, RuntimeError(summary["error"]))
        raise CoordinatorFailed(f"{summary['error']}{hint}")
    return summary


def _create_run(experiment: dict[str, Any]) -> str:
    from fed_auc.run.frame import new_run  # deferred: the node commands never need it

    config = experiment["experiment"]
    record = {**config, "flower": experiment["flower"]}
    with RunStore(config["runs_dir"]) as store:
        return new_run(store, config["algorithm"], record)


def _mark_stopped(runs_dir: str, run_id: str, why: BaseException) -> None:
    """Say in the run's events how to continue it, and fail a run still "running" after its
    coordinator stopped (the ServerApp, stopped with it, may have recorded its failure first:
    then only the event is added)."""
    reason = "stopped by the operator" if isinstance(why, KeyboardInterrupt) else str(why)
    with RunStore(runs_dir) as store:
        store.abandon_run(
            run_id,
            reason,
            f"coordinator stopped: {reason}; continue with "
            f"`fed-auc coordinator --resume {run_id} --runs-dir {runs_dir}`",
        )


def _serve(
    experiment: dict[str, Any],
    settings: FlowerSettings,
    work_dir: Path,
    summary_file: Path,
    echo,
) -> None:
    """The SuperLink and the ``flwr run`` of the app, streaming its lines to ``echo``."""
    home = work_dir / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    env = flower_env(home)
    certs = None if settings.insecure else Path(settings.certs_dir).resolve()
    # site → key fingerprint; two sites listed with one key are refused before anything starts
    site_keys = {} if certs is None else read_site_keys(certs / "keys")
    _write_connection(home, reachable(settings.address), certs)
    host, port = settings.address.rsplit(":", 1)
    command = [
        "flower-superlink",
        "--host",
        host,
        "--port",
        port,
        "--disable-runtime-dependency-installation",
    ]  # no --database: Flower's in-memory state (a SQLite file locks under many objects)
    if certs is None:
        command.append("--insecure")
    else:
        command += ["--ssl-ca-certfile", str(certs / "ca.pem")]
        command += ["--ssl-certfile", str(certs / "server.pem")]
        command += ["--ssl-keyfile", str(certs / "server.key"), "--enable-supernode-auth"]
    experiment_file = work_dir / "experiment.json"
    progress_file = work_dir / "progress.log"
    progress_file.write_text("")
    files = {"summary_file": str(summary_file), "progress_file": str(progress_file)}
    # the ServerApp fails the run and exits if this process ends without stopping it (SIGKILL)
    files["coordinator"] = ProcessIdentity.current().to_dict()
    superlink_log = work_dir / "superlink.log"
    start = superlink_log.stat().st_size if superlink_log.exists() else 0
    with open(superlink_log, "ab") as log:  # it dies with us, even by SIGKILL
        superlink = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    superlink_done = threading.Event()
    try:
        wait_for_port(reachable(settings.address), 60, superlink)
        if certs is not None:
            registered = register_keys(home, certs / "keys")
            for key in registered:
                echo(f"registered site key {key} ({site_keys[Path(key).stem]})")
            # which key each Flower node holds: the ServerApp binds sites to them (identity)
            files["node_keys"] = {
                str(node): {"site": Path(key).stem, "fingerprint": site_keys[Path(key).stem]}
                for key, node in registered.items()
            }
            # a node refused for its key is said here too, once per key
            refusals = _key_refusals(registered, certs / "keys")
            threading.Thread(
                target=follow_log,
                args=(superlink_log, echo, superlink_done, refusals, start),
                daemon=True,
            ).start()
        experiment_file.write_text(json.dumps({**experiment, **files}))
        app = write_app(work_dir / "app")
        overrides = f'experiment-file="{experiment_file}"'
        run = ["flwr", "run", str(app), CONNECTION, "--stream", "--run-config", overrides]
        stream = subprocess.Popen(
            run,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent,
        )
        done = threading.Event()
        follower = threading.Thread(target=follow_log, args=(progress_file, echo, done))
        follower.start()
        try:
            relay(stream.stdout, echo)  # Flower's own messages (and a ServerApp's traceback)
        finally:
            if stream.poll() is None:
                stream.terminate()
            done.set()
            follower.join()
        if stream.wait() != 0:
            raise RuntimeError(f"flwr run failed with exit code {stream.returncode}")
    finally:
        superlink_done.set()
        stop_tree(superlink)


UNKNOWN_KEY = "No SuperNode found with the given public key"  # the SuperLink refused a node


def _key_refusals(registered: Iterable[str], keys_dir: Path):
    """For ``follow_log`` over the SuperLink's log: one line per key it refused."""
    seen: set[str] = set()

    def select(line: str) -> str | None:
        if UNKNOWN_KEY not in line:
            return None
        key = line.split("public key:", 1)[-1].split(", exception", 1)[0]
        if key in seen:
            return None
        seen.add(key)
        return (
            "a node tried to join with a key that is not registered here (refused); "
            f"registered: {sorted(registered)} from {keys_dir}: a new site's .pub goes there, "
            "then restart the coordinator (--resume RUN_ID)"
        )

    return select


def _write_connection(home: Path, address: str, certs: Path | None) -> None:
    """The ``flwr`` CLI's connection to our SuperLink (in our own FLWR_HOME)."""
    security = "insecure = true" if certs is None else f'root-certificates = "{certs / "ca.pem"}"'
    text = f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
    (home / "config.toml").write_text(text + f'address = "{address}"\n{security}\n')


def register_keys(home: Path, keys_dir: Path) -> dict[str, int]:
    """Register every ``<site>.pub`` with the SuperLink: only these nodes may join. Returns
    the Flower node id of each (file name → id): the node that holds that key gets it.

    Through the Control API client the ``flwr supernode register`` command uses, in this
    process: one ``flwr`` process per key costs tens of seconds of start-up on a busy machine.
    """
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import RegisterNodeRequest

    os.environ["FLWR_HOME"] = str(home)
    client = init_http_client_from_connection(read_superlink_connection(CONNECTION))
    try:
        nodes = {}
        for path in sorted(keys_dir.glob("*.pub")):
            key = try_load_public_key(path)
            reply = client.RegisterNode(RegisterNodeRequest(public_key=key, name=path.stem))
            nodes[path.name] = reply.node_id
        return nodes
    finally:
        client.close()


# -- node ---------------------------------------------------------------------------------
def run_node(
    site: SiteDefinition,
    coordinator: str,
    root_certificates: Path | None,
    auth_key: Path | None,
    echo=print,
) -> int:
    """Serve the site until stopped (SIGTERM / Ctrl-C); the SuperNode is restarted if it exits.

    The SuperNode runs with ``--isolation process`` and this process, where the worker keeps
    data and model warm, executes its ClientApp tasks (``flower.executor``).
    """
    state_dir = site.state_dir.resolve()
    lock = lock_state_dir(state_dir)  # StateDirBusy: another node serves from it
    port = free_port()  # the SuperNode's Runtime API (127.0.0.1), for our executor only
    command = [sys.executable, "-m", "fed_auc.transport.flower.supernode"]
    command += ["--superlink", coordinator, "--isolation", "process", "--port", str(port)]
    if root_certificates is None:
        command.append("--insecure")
    else:
        command += ["--root-certificates", str(Path(root_certificates).resolve())]
    if auth_key is not None:
        command += ["--auth-supernode-private-key", str(Path(auth_key).resolve())]
    command += ["--node-config", f'site="{site.name}"']
    env = flower_env(state_dir / "flwr_home")
    stopping = threading.Event()
    supernode: subprocess.Popen | None = None
    key = None if auth_key is None else key_file_fingerprint(auth_key)
    watch = SupernodeWatch(site.name, coordinator, root_certificates, state_dir, key)
    worker = NodeWorker(site, echo, on_request=watch.heard)

    def supervise() -> None:
        """Keep a SuperNode running: it gives up when the coordinator is not (yet) there."""
        nonlocal supernode
        log_path = state_dir / "supernode.log"
        while not stopping.is_set():
            start = log_path.stat().st_size if log_path.exists() else 0
            with open(log_path, "ab") as log:
                supernode = subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent,
                    start_new_session=True,
                )
            wait_or_unstick(supernode, log_path, start, stopping, watch, echo)
            if not stopping.is_set():
                watch.feed(read_from(log_path, start))
                line = watch.exited(supernode.returncode, log_path)
                if line:
                    echo(line)
                stopping.wait(RESTART_DELAY_S)

    threading.Thread(target=supervise, daemon=True).start()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C
    echo(f"{site.name}: node up, coordinator {coordinator} "
         f"(state {state_dir}, SuperNode log {state_dir / 'supernode.log'})")  # fmt: skip
    try:
        serve_tasks(f"127.0.0.1:{port}", worker.handle, site.name, stopping)
    except KeyboardInterrupt:
        pass
    finally:
        stopping.set()
        if supernode is not None:
            kill_group(supernode.pid)
            supernode.wait(timeout=30)
        unlock_state_dir(lock)
    echo(f"{site.name}: node stopped")
    return 0


class CoordinatorFailed(RuntimeError):
    """A Flower run that failed: one line for the console (what failed, how to go on)."""


class CoordinatorStopped(KeyboardInterrupt):
    """``fed-auc coordinator`` stopped by Ctrl-C or SIGTERM, everything it started with it."""

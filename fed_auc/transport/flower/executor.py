"""A warm ClientApp executor: the node worker runs Flower's ClientApp tasks itself.

By default a SuperNode's SuperExec starts a fresh ``flwr-clientapp`` process for every
message; importing Flower there alone costs 1.5–3 s, on every train and every evaluation.
``fed-auc node`` instead starts its SuperNode with ``--isolation process`` and runs this loop
in the long-lived worker process: it takes each ClientApp task from the SuperNode's Runtime
API, pulls the message, answers it with the worker's ``handle`` (data and model already in
memory) and pushes the reply, the steps ``flwr-clientapp`` takes, without a process start.

The node executes only the fed-auc code installed on it: the Flower app (FAB) the
coordinator submits is never installed or run here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor
from flwr.supercore.retry.retry_invoker import RetryInvoker, exponential
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from fed_auc.exchange import NodeRefused, refusal
from fed_auc.transport.flower import backoff
from fed_auc.transport.flower.client import frame_content, message_frame

log = logging.getLogger("fed_auc.node.node")

Handler = Callable[[dict[str, Any], list[bytes]], tuple[dict[str, Any], list[bytes]]]

# How often to ask the SuperNode for a new task (SuperExec's default is 1 s).
TASK_POLL_S = 0.05


def _retries(tries: int) -> RetryInvoker:
    """Retry connection errors a few times, briefly. (Flower's own invoker backs off up to
    minutes, so a restarted node would rejoin late, and it signals its process to stop on an
    HTTP 401: here the process is the node.)"""
    return RetryInvoker(
        wait_gen_factory=lambda: exponential(base_delay=0.1, max_delay=1),
        recoverable_exceptions=httpx.TransportError,
        max_tries=tries,
        max_time=None,
    )


def answer(message: Message, handle: Handler, site: str) -> Message:
    """The reply to one fed-auc message; an error of the worker becomes a Flower error reply."""
    try:
        header, buffers = handle(*message_frame(message.content))
    except NodeRefused as exc:  # on purpose (e.g. a spent budget): its status travels
        header, buffers = {"error": refusal(exc)}, []
    except ValueError as exc:  # bad input: the worker said it in one line; no traceback
        log.debug("%s: request refused: %s", site, exc)
        header, buffers = {"error": f"{type(exc).__name__}: {exc}"}, []
    except Exception as exc:  # the coordinator records it as this site's error
        log.exception("%s: request failed", site)
        header, buffers = {"error": f"{type(exc).__name__}: {exc}"}, []
    if "error" in header:
        reason = f"node {site}: {header['error']}"
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                       reply_to=message)  # fmt: skip
    return Message(frame_content(header, buffers), reply_to=message)


def run_task(address: str, token: str, handle: Handler, site: str) -> None:
    """One ClientApp task, as ``flwr-clientapp`` runs it: pull, answer, push, report."""
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,  # the SuperNode's Runtime API listens on 127.0.0.1 only
        root_certificates=None,
        interceptors=[RuntimeTokenHttpInterceptor(token)],
        retry_invoker=_retries(5),
    )
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    context: Context | None = None
    status, details = SubStatus.FAILED, "the fed-auc node could not run the task"
    try:
        heartbeat.start()
        message, context, _, _ = pull_task_input(client)
        push_message(client, answer(message, handle, site), context)
        status, details = SubStatus.COMPLETED, ""
    except Exception:
        log.exception("%s: Flower task failed", site)
    finally:
        push_task_output(client, context, status, details)
        heartbeat.stop()
        client.close()


def serve_tasks(address: str, handle: Handler, site: str, stop: threading.Event) -> None:
    """Take ClientApp tasks from the SuperNode at ``address`` until ``stop`` is set."""
    backoff.shorten(backoff.LOCAL_CAP_S)  # a task's message is pulled while the SuperNode
    # still receives it
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[],
        retry_invoker=_retries(1),
    )
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    try:
        while not stop.is_set():
            try:
                acquired = client.AcquireTask(request)
            except httpx.HTTPError as exc:  # the SuperNode is (re)starting
                log.debug("%s: no SuperNode Runtime API yet: %s", site, exc)
                stop.wait(0.5)
                continue
            if acquired.HasField("task") and acquired.token:
                run_task(address, acquired.token, handle, site)
            else:
                stop.wait(TASK_POLL_S)
    finally:
        client.close()

"""The Flower ClientApp: a thin relay from the SuperNode to the site's long-lived node worker.

Flower starts a fresh ClientApp process for every message. Importing torch and MONAI and
rebuilding the node there would cost seconds per message, so this module imports only the
standard library and Flower: it hands the message's header and raw buffers to the node
worker (``fed-auc node`` keeps it running, with data and model warm) over a local socket
authenticated with a per-node key, and returns the worker's answer as the reply.

The Flower app that ships this module imports it by file (see ``flower_launch``), so it
must not import anything from ``fed_auc``.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

HEADER, BUFFERS = "header", "buffers"

app = ClientApp()


def send_frame(conn: Connection, header: dict[str, Any], buffers: list[bytes]) -> None:
    """One frame: the JSON header (with the buffer count), then each buffer as it is."""
    conn.send_bytes(json.dumps({**header, "buffers": len(buffers)}).encode())
    for buffer in buffers:
        conn.send_bytes(buffer)


def recv_frame(conn: Connection) -> tuple[dict[str, Any], list[bytes]]:
    header = json.loads(conn.recv_bytes())
    return header, [conn.recv_bytes() for _ in range(header.pop("buffers"))]


def message_frame(content: RecordDict) -> tuple[dict[str, Any], list[bytes]]:
    """Header and buffers of a fed-auc Flower message (the inverse of ``frame_content``)."""
    header = json.loads(str(content[HEADER]["json"]))
    arrays = content[BUFFERS]
    return header, [arrays[f"b{i}"].data for i in range(len(arrays))]


def frame_content(header: dict[str, Any], buffers: list[bytes]) -> RecordDict:
    """Raw buffers as opaque byte arrays: nothing on the way converts or copies them."""
    arrays = {
        f"b{i}": Array(dtype="uint8", shape=(len(b),), stype="raw", data=b)
        for i, b in enumerate(buffers)
    }
    return RecordDict(
        {
            HEADER: ConfigRecord({"json": json.dumps(header)}),
            BUFFERS: ArrayRecord(array_dict=arrays),
        }
    )


def relay(message: Message, context: Context) -> Message:
    """Forward to the node worker named in the node config; its error becomes ours."""
    address = str(context.node_config["worker-socket"])
    authkey = Path(str(context.node_config["worker-key"])).read_bytes()
    header, buffers = message_frame(message.content)
    with Client(address, family="AF_UNIX", authkey=authkey) as conn:
        send_frame(conn, header, buffers)
        answer, answer_buffers = recv_frame(conn)
    if "error" in answer:
        raise RuntimeError(f"node {context.node_config.get('site', '?')}: {answer['error']}")
    return Message(frame_content(answer, answer_buffers), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    return relay(message, context)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    return relay(message, context)


@app.query()
def query(message: Message, context: Context) -> Message:
    return relay(message, context)

"""fed-auc messages as Flower records, and the Flower app's ClientApp entry.

A message is a JSON header (a ``ConfigRecord``) plus the codec's raw byte buffers (an
``ArrayRecord`` of opaque ``uint8`` arrays, which nothing on the way converts or copies).

``fed-auc node`` answers its messages itself, in its long-lived worker (``flower.executor``):
the ClientApp of the Flower app the coordinator submits never runs on a fed-auc node. It
exists because a Flower app must name one; on a plain ``flower-supernode`` it refuses.

The Flower app that ships this module imports it by file (see ``flower.launch``), so it
must not import anything from ``fed_auc``.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

HEADER, BUFFERS = "header", "buffers"

app = ClientApp()


def message_frame(content: RecordDict) -> tuple[dict[str, Any], list[bytes]]:
    """Header and buffers of a fed-auc Flower message (the inverse of ``frame_content``)."""
    header = json.loads(str(content[HEADER]["json"]))
    arrays = content[BUFFERS]
    return header, [arrays[f"b{i}"].data for i in range(len(arrays))]


def frame_content(
    header: dict[str, Any], buffers: list[bytes], shared: dict[int, Array] | None = None
) -> RecordDict:
    """Raw buffers as opaque byte arrays: nothing on the way converts or copies them.

    ``shared`` (id of a buffer → its Array), across the messages of one request, whose
    buffers it must not outlive: messages that carry the same bytes object (the same model
    to every site) share its Array, which Flower then chunks and hashes once, not per site."""
    shared = {} if shared is None else shared
    arrays = ArrayRecord()  # filled item by item: ``array_dict=`` would copy each Array
    for i, b in enumerate(buffers):
        if id(b) not in shared:
            shared[id(b)] = Array(dtype="uint8", shape=(len(b),), stype="raw", data=b)
        arrays[f"b{i}"] = shared[id(b)]
    return RecordDict({HEADER: ConfigRecord({"json": json.dumps(header)}), BUFFERS: arrays})


def refuse(message: Message, context: Context) -> Message:
    raise RuntimeError(
        "fed-auc requests are answered by `fed-auc node` (its own worker), "
        "not by a plain flower-supernode"
    )


app.train()(refuse)
app.evaluate()(refuse)
app.query()(refuse)

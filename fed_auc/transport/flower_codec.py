"""Requests and replies as one JSON header plus a few flat byte buffers (one per dtype).

Flower moves every array of a record, and every 5 MiB chunk of it, as its own HTTP object
through every hop, so a DenseNet's ~700 tensors sent as they are cost seconds per message.
Here a payload is one buffer per dtype (usually one float32 buffer) plus a name/dtype/shape
index in the header: a handful of objects whatever the model.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from fed_auc.algorithms.base import Broadcast, Reply
from fed_auc.metrics import AUCResult
from fed_auc.node import Evaluation, SplitEvaluation
from fed_auc.trainable import Tensors

Frame = tuple[dict[str, Any], list[bytes]]
"""A message as it travels: a JSON-able header and the raw buffers its ``index`` describes."""


# The baseline of benchmarks/flower_overhead.py: every tensor its own array, as a plain
# state_dict-as-ArrayRecord transport sends it. The decoder reads either layout.
PER_TENSOR_ENV = "FED_AUC_FLOWER_PER_TENSOR"


def encode_tensors(tensors: Tensors) -> tuple[list[list[Any]], list[bytes]]:
    """Index (name, dtype, shape, buffer number) and one contiguous buffer per dtype."""
    per_tensor = os.environ.get(PER_TENSOR_ENV) == "1"
    groups: dict[Any, list[torch.Tensor]] = {}
    index = []
    for name, tensor in tensors.items():
        key = name if per_tensor else tensor.dtype
        group = groups.setdefault(key, [])
        buffer = list(groups).index(key)
        index.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), buffer])
        group.append(tensor.detach().reshape(-1))
    buffers = [torch.cat(group).numpy().tobytes() for group in groups.values()]
    return index, buffers


def decode_tensors(index: list[list[Any]], buffers: list[bytes]) -> Tensors:
    """Inverse of ``encode_tensors``; checks that the buffers hold what the index says."""
    by_buffer: dict[int, list[list[Any]]] = {}
    for entry in index:
        by_buffer.setdefault(entry[3], []).append(entry)
    out: Tensors = {}
    for number, entries in by_buffer.items():
        dtype = getattr(torch, entries[0][1])
        sizes = [int(np.prod(shape, dtype=np.int64)) for _, _, shape, _ in entries]
        flat = torch.frombuffer(bytearray(buffers[number]), dtype=dtype)
        if flat.numel() != sum(sizes):
            raise ValueError(
                f"payload buffer {number} holds {flat.numel()} {entries[0][1]} values, "
                f"its index describes {sum(sizes)}"
            )
        for (name, _, shape, _), part in zip(entries, torch.split(flat, sizes), strict=True):
            out[name] = part.view(shape)
    return {name: out[name] for name, *_ in index}


def tensor_frame(header: dict[str, Any], tensors: Tensors) -> Frame:
    index, buffers = encode_tensors(tensors)
    return {**header, "index": index}, buffers


def frame_tensors(frame: Frame) -> Tensors:
    header, buffers = frame
    return decode_tensors(header["index"], buffers)


# -- train ------------------------------------------------------------------------------
def broadcast_frame(broadcast: Broadcast, setup: dict[str, Any]) -> Frame:
    header = {
        "kind": "train",
        "setup": setup,
        "round": broadcast.round,
        "phase": broadcast.phase,
        "config": broadcast.config,
    }
    return tensor_frame(header, broadcast.tensors)


def frame_broadcast(frame: Frame) -> Broadcast:
    header = frame[0]
    return Broadcast(header["round"], header["phase"], frame_tensors(frame), header["config"])


def reply_frame(reply: Reply) -> Frame:
    header = {
        "steps": reply.steps,
        "metrics": reply.metrics,
        "num_examples": reply.num_examples,
        "site": reply.site,
        "round": reply.round,
        "phase": reply.phase,
    }
    return tensor_frame(header, reply.tensors)


def frame_reply(frame: Frame) -> Reply:
    h = frame[0]
    return Reply(
        frame_tensors(frame),
        h["steps"],
        h["metrics"],
        h["num_examples"],
        h["site"],
        h.get("round"),  # a reply that does not say is refused by the coordinator
        h.get("phase"),
    )


# -- evaluate ---------------------------------------------------------------------------
def evaluation_frame(evaluation: Evaluation) -> Frame:
    """Counts and AUCs in the header; per-image scores and labels only if they were pooled."""
    splits, tensors = {}, {}
    for name, split in evaluation.splits.items():
        splits[name] = {
            "n": split.n,
            "positives": split.positives,
            "aucs": [dataclasses.asdict(a) for a in split.aucs],
        }
        if split.scores is not None:
            tensors[f"scores/{name}"] = torch.from_numpy(np.ascontiguousarray(split.scores))
            tensors[f"labels/{name}"] = torch.from_numpy(np.ascontiguousarray(split.labels))
    header = {"site": evaluation.site, "duration_s": evaluation.duration_s, "splits": splits}
    return tensor_frame(header, tensors)


def frame_evaluation(frame: Frame) -> Evaluation:
    header, tensors = frame[0], frame_tensors(frame)
    result = Evaluation(header["site"], duration_s=header["duration_s"])
    for name, split in header["splits"].items():
        scores, labels = tensors.get(f"scores/{name}"), tensors.get(f"labels/{name}")
        result.splits[name] = SplitEvaluation(
            n=split["n"],
            positives=split["positives"],
            aucs=[AUCResult(**a) for a in split["aucs"]],
            scores=None if scores is None else scores.numpy(),
            labels=None if labels is None else labels.numpy(),
        )
    return result

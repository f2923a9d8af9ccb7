"""Requests and replies as one JSON header plus a few flat byte buffers (one per dtype).

Flower moves every array of a record, and every 5 MiB chunk of it, as its own HTTP object
through every hop, so a DenseNet's ~700 tensors sent as they are cost seconds per message.
Here a payload is one buffer per dtype (usually one float32 buffer) plus a name/dtype/shape
index in the header: a handful of objects whatever the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from fed_auc.exchange import Broadcast, Evaluation, Reply, SplitEvaluation
from fed_auc.metrics.auc import AUCResult
from fed_auc.trainable import Tensors

Frame = tuple[dict[str, Any], list[bytes]]
"""A message as it travels: a JSON-able header and the raw buffers its ``index`` describes."""


# The baseline of benchmarks/systems/flower_overhead.py: every tensor its own array, as a plain
# state_dict-as-ArrayRecord transport sends it. The decoder reads either layout.
PER_TENSOR_ENV = "FED_AUC_FLOWER_PER_TENSOR"


def digest(tensor: torch.Tensor) -> str:
    """Content tag of a tensor: equal tags, equal dtype, shape and bytes."""
    tag = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    tag.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # no copy
    return tag.hexdigest()[:32]  # SHA-256 (hardware-accelerated on current CPUs), 128 bits


def encode_tensors(
    tensors: Tensors, known: Collection[str] | None = None, memo: dict[Any, Any] | None = None
) -> tuple[list[list[Any]], list[bytes]]:
    """Index (name, dtype, shape, buffer number) and one contiguous buffer per dtype.

    With ``known`` (the content tags the receiver holds, see ``TensorCache``) every entry also
    carries its tensor's tag, and a tensor whose tag is known travels as the tag alone
    (buffer number -1): the receiver already has its bytes. ``memo`` (tensor id → tag, and
    the tensor ids of a buffer → its bytes) saves hashing and copying the same tensors again
    for every site of a request, whose sites then share one bytes object per buffer (Flower
    hashes and chunks it once, ``client.frame_content``); it must not outlive them.
    """
    memo = {} if memo is None else memo
    per_tensor = os.environ.get(PER_TENSOR_ENV) == "1"
    known = None if per_tensor else known  # the naive baseline sends everything every time
    groups: dict[Any, list[torch.Tensor]] = {}
    members: dict[Any, list[int]] = {}  # the ids of each group's tensors (``memo`` keys)
    index = []
    for name, tensor in tensors.items():
        entry = [name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), -1]
        index.append(entry)
        if known is not None:
            if id(tensor) not in memo:
                memo[id(tensor)] = digest(tensor)
            entry.append(memo[id(tensor)])
            if entry[4] in known:
                continue
        key = name if per_tensor else tensor.dtype
        group = groups.setdefault(key, [])
        entry[3] = list(groups).index(key)
        group.append(tensor.detach().reshape(-1))
        members.setdefault(key, []).append(id(tensor))
    buffers = []
    for key, group in groups.items():
        if per_tensor:  # the naive baseline: every site its own copy
            buffers.append(torch.cat(group).numpy().tobytes())
            continue
        shared = ("buffer", *members[key])
        if shared not in memo:
            memo[shared] = torch.cat(group).numpy().tobytes()
        buffers.append(memo[shared])
    return index, buffers


def decode_tensors(
    index: list[list[Any]], buffers: list[bytes], cache: TensorCache | None = None
) -> Tensors:
    """Inverse of ``encode_tensors``; checks that the buffers hold what the index says.
    Tagged tensors are remembered in ``cache``; untransmitted ones are taken from it."""
    by_buffer: dict[int, list[list[Any]]] = {}
    for entry in index:
        by_buffer.setdefault(entry[3], []).append(entry)
    out: Tensors = {}
    for number, entries in by_buffer.items():
        if number == -1:
            for name, _, _, _, tag in entries:
                out[name] = _cached(cache, name, tag)
            continue
        dtype = getattr(torch, entries[0][1])
        sizes = [int(np.prod(entry[2], dtype=np.int64)) for entry in entries]
        flat = torch.frombuffer(bytearray(buffers[number]), dtype=dtype)
        if flat.numel() != sum(sizes):
            raise ValueError(
                f"payload buffer {number} holds {flat.numel()} {entries[0][1]} values, "
                f"its index describes {sum(sizes)}"
            )
        for entry, part in zip(entries, torch.split(flat, sizes), strict=True):
            out[entry[0]] = part.view(entry[2])
    tensors = {name: out[name] for name, *_ in index}
    if cache is not None:
        cache.remember({entry[4]: tensors[entry[0]] for entry in index if len(entry) > 4})
    return tensors


def _cached(cache: TensorCache | None, name: str, tag: str) -> torch.Tensor:
    if cache is None or tag not in cache.tensors:
        raise ValueError(f"tensor {name!r} was sent as cached copy {tag}, which this node lacks")
    return cache.tensors[tag].clone()  # the cache's copy stays as it was sent


class TensorCache:
    """The receiver's copies of the tensors of its last two requests, by content tag.

    Two, because a tensor often comes back one request later: the model a node evaluates is
    the one the next training request sends, and CODASCA's proximal reference v_ref changes
    only at stage starts. The receiver tells the sender ``tags()`` with every answer; the
    sender sends those tensors as tags alone.
    """

    def __init__(self) -> None:
        self._last: dict[str, torch.Tensor] = {}
        self.tensors: dict[str, torch.Tensor] = {}

    def remember(self, tagged: dict[str, torch.Tensor]) -> None:
        copies = {tag: tensor.clone() for tag, tensor in tagged.items()}  # safe from in-place ops
        self.tensors = {**self._last, **copies}
        self._last = copies

    def tags(self) -> list[str]:
        return sorted(self.tensors)


def tensor_frame(
    header: dict[str, Any],
    tensors: Tensors,
    known: Collection[str] | None = None,
    memo: dict[int, str] | None = None,
) -> Frame:
    index, buffers = encode_tensors(tensors, known, memo)
    return {**header, "index": index}, buffers


def frame_tensors(frame: Frame, cache: TensorCache | None = None) -> Tensors:
    header, buffers = frame
    return decode_tensors(header["index"], buffers, cache)


# -- compare: two models in one frame ----------------------------------------------------
PAIR = ("a/", "b/")  # the prefixes of model A's and model B's tensors in a comparison


def pair_tensors(tensors: tuple[Tensors, Tensors]) -> Tensors:
    """Both models' tensors as one set, each name prefixed by its model (``PAIR``)."""
    return {f"{p}{name}": t for p, part in zip(PAIR, tensors, strict=True)
            for name, t in part.items()}  # fmt: skip


def unpair_tensors(tensors: Tensors) -> tuple[Tensors, Tensors]:
    """``pair_tensors`` undone; a name with neither prefix is an error."""
    parts: tuple[Tensors, Tensors] = ({}, {})
    for name, tensor in tensors.items():
        if not name.startswith(PAIR):
            raise ValueError(f"tensor {name!r} of a comparison belongs to neither model")
        parts[PAIR.index(name[:2])][name[2:]] = tensor
    return parts


# -- train ------------------------------------------------------------------------------
def broadcast_frame(
    broadcast: Broadcast,
    setup: dict[str, Any],
    known: Collection[str] | None = None,
    memo: dict[int, str] | None = None,
) -> Frame:
    header = {
        "kind": "train",
        "setup": setup,
        "round": broadcast.round,
        "phase": broadcast.phase,
        "config": broadcast.config,
    }
    return tensor_frame(header, broadcast.tensors, known, memo)


def frame_broadcast(frame: Frame, cache: TensorCache | None = None) -> Broadcast:
    header = frame[0]
    tensors = frame_tensors(frame, cache)
    return Broadcast(header["round"], header["phase"], tensors, header["config"])


def reply_frame(reply: Reply) -> Frame:
    header = {
        "steps": reply.steps,
        "metrics": reply.metrics,
        "num_examples": reply.num_examples,
        "site": reply.site,
        "round": reply.round,
        "phase": reply.phase,
        "trained_groups": reply.trained_groups,
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
        h.get("trained_groups"),  # partial training: the suffix of layer groups it sent
    )


# -- evaluate ---------------------------------------------------------------------------
def evaluation_frame(evaluation: Evaluation) -> Frame:
    """Counts, AUCs and ROC points in the header (the personal model's too); per-image scores
    and labels only if they were pooled."""
    tensors: dict[str, torch.Tensor] = {}
    header = {
        "site": evaluation.site,
        "duration_s": evaluation.duration_s,
        "splits": _splits_header(evaluation.splits, tensors),
        "personal": None
        if evaluation.personal is None
        else _splits_header(evaluation.personal, {}),
    }
    return tensor_frame(header, tensors)


def _splits_header(
    splits: dict[str, SplitEvaluation], tensors: dict[str, torch.Tensor]
) -> dict[str, Any]:
    out = {}
    for name, split in splits.items():
        out[name] = {
            "n": split.n,
            "positives": split.positives,
            "aucs": [dataclasses.asdict(a) for a in split.aucs],
            "roc": split.roc,
            "bins": split.bins,
        }
        if split.scores is not None:
            tensors[f"scores/{name}"] = torch.from_numpy(np.ascontiguousarray(split.scores))
            tensors[f"labels/{name}"] = torch.from_numpy(np.ascontiguousarray(split.labels))
    return out


def frame_evaluation(frame: Frame) -> Evaluation:
    header, tensors = frame[0], frame_tensors(frame)
    result = Evaluation(header["site"], duration_s=header["duration_s"])
    result.splits = _splits_of(header["splits"], tensors)
    if header.get("personal") is not None:
        result.personal = _splits_of(header["personal"], {})
    return result


def _splits_of(header: dict[str, Any], tensors: Tensors) -> dict[str, SplitEvaluation]:
    out = {}
    for name, split in header.items():
        scores, labels = tensors.get(f"scores/{name}"), tensors.get(f"labels/{name}")
        out[name] = SplitEvaluation(
            n=split["n"],
            positives=split["positives"],
            aucs=[AUCResult(**a) for a in split["aucs"]],
            scores=None if scores is None else scores.numpy(),
            labels=None if labels is None else labels.numpy(),
            roc=split.get("roc"),
            bins=split.get("bins"),
        )
    return out

"""Backends on tiny trainables: the batches, the model and the round loop the backend tests
share."""

from __future__ import annotations

import torch

from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.trainable import Trainable

NO_EXTRAS = {"weight_decay": 0.0, "grad_clip": None}


def _batches(n: int, seed: int = 0, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.rand(size, 1, 16, 16, generator=gen, dtype=torch.float64)
        y = torch.zeros(size, 1, dtype=torch.float64)
        y[: size // 4] = 1.0
        out.append((x, y))
    return out


def _trainable(loss: str = "auc_margin", seed: int = 0) -> Trainable:
    torch.manual_seed(seed)
    model = build_model("tiny").double()
    return Trainable(model, build_loss(loss, 1, [0.25]).double())


def _run(backend, sites: list[Trainable], streams, rounds: int, participation=None):
    """Drive plan → client_update → complete_reply → aggregate by hand, as the coordinator
    does; returns the final state and locals."""
    state = backend.init_server(sites[0], {f"site{k}": 10 * (k + 1) for k in range(len(sites))})
    local = [{} for _ in sites]
    for r in range(rounds):
        chosen = participation[r] if participation else range(len(sites))
        broadcast = backend.plan(state, r)
        replies = []
        for k in chosen:
            reply, local[k] = backend.client_update(broadcast, local[k], sites[k], streams[k])
            reply.num_examples, reply.site = 10 * (k + 1), f"site{k}"
            replies.append(backend.complete_reply(reply, broadcast))
        state = backend.aggregate(state, replies)
    return state, local

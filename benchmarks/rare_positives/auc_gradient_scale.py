"""How hard the AUC-margin loss pushes the network after a cross-entropy warm-up, against CE.

After a CE warm-up on sites with 5 % positives the sigmoid scores sit near p, where
h(1 − h) ≈ p(1 − p): the AUC-margin loss acts on h, so its gradient on the logits carries
that factor, while CE's gradient on the logits is σ − y. This loads the warm-up's network
of a finished ``fed-auc simulate`` run (``<run>/warmup/checkpoint.pt``), draws batches of
32 with the run's positive floor (2 positives) from the pooled training images of the same
partition, and compares the gradient norms on the network's weights: CE, and the AUC-margin
loss at its saddle values for the batch (a, b = the class means of h, α = m + b − a).

    python -m benchmarks.rare_positives.auc_gradient_scale RUN_DIR \\
        --partition imratio:0.05,0.05,0.05,0.05
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from benchmarks.common.paths import BREASTMNIST as NPZ
from fed_auc.data.medmnist import load_medmnist
from fed_auc.data.partition import partition_pool
from fed_auc.io import load_state
from fed_auc.losses import AUCMarginLoss, CrossEntropyLoss
from fed_auc.models import build_model
from fed_auc.trainable import BUFFER, WEIGHT


def warm_network(run: Path, arch: str) -> torch.nn.Module:
    """The network the warm-up ended with (its server state's ``model``)."""
    state = load_state(run / "warmup" / "checkpoint.pt")
    tensors = state["state"]["model"]  # the coordinator's checkpoint: {round, state, ...}
    model = build_model(arch)
    model.load_state_dict(
        {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith((WEIGHT, BUFFER))}
    )
    return model


def grad_norm(model: torch.nn.Module, loss: torch.nn.Module, x, y) -> float:
    model.zero_grad()
    loss(model(x), y).backward()
    return float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder of fed-auc simulate (with warmup/)")
    parser.add_argument("--partition", default="imratio:0.05,0.05,0.05,0.05")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (its partition)")
    parser.add_argument("--arch", default="tiny")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = warm_network(args.run, args.arch).train()
    pool = load_medmnist(NPZ, 28, positive_label=0)
    sites, _ = partition_pool(pool, args.partition, 4, args.seed)
    x = torch.cat([s.train.images for s in sites])
    y = torch.cat([s.train.labels for s in sites])
    p = float(y.mean())
    pos, neg = torch.nonzero(y[:, 0] == 1).flatten(), torch.nonzero(y[:, 0] == 0).flatten()
    gen = torch.Generator().manual_seed(0)
    ratios, slopes = [], []
    for _ in range(args.batches):
        rows = torch.cat([pos[torch.randint(len(pos), (2,), generator=gen)],
                          neg[torch.randint(len(neg), (30,), generator=gen)]])  # fmt: skip
        xb, yb = x[rows], y[rows]
        aucm = AUCMarginLoss(pos_ratio=p)
        with torch.no_grad():
            h = torch.sigmoid(model(xb))
            slopes.append(float((h * (1 - h)).mean()))
            aucm.a.fill_(float(h[yb == 1].mean()))
            aucm.b.fill_(float(h[yb == 0].mean()))
            aucm.alpha.fill_(aucm.margin + float(aucm.b - aucm.a))
        ratios.append(grad_norm(model, aucm, xb, yb) / grad_norm(model, CrossEntropyLoss(), xb, yb))
    print(
        f"p = {p:.3f}; mean h(1-h) = {statistics.fmean(slopes):.3f}; gradient norm AUC-margin / "
        f"CE: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}–{max(ratios):.3f}) "
        f"over {args.batches} batches"
    )


if __name__ == "__main__":
    main()

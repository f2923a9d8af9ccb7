"""How hard is the synthetic federation? Prints the numbers the data is tuned to.

1. Generation time (4 default sites at 28 px and 64 px).
2. Trivial scores on the pooled test set: mean pixel intensity (should be ~0.5-0.65) and
   logistic regression on raw pixels.
3. A tiny MONAI DenseNet trained on the pooled train sets for --steps SGD steps: pooled and
   per-site test AUC (should clearly beat chance, not reach 1.0).
4. Scanner shift: a model trained on st_elsewhere alone, scored on the same mercy_rural
   patients imaged with st_elsewhere's scanner and with mercy_rural's own scanner.

Usage: python benchmarks/synthetic_difficulty.py [--steps 300] [--seeds 0 1 2]
Takes about a minute per seed on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch
import torch.nn.functional as F
from monai.networks.nets import DenseNet
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from fed_auc.data.base import SiteData, Split
from fed_auc.data.sampling import BatchStream
from fed_auc.data.synthetic import DEFAULT_PROFILES, make_site, make_synthetic_federation

SCANNER_FIELDS = ("intensity_shift", "contrast", "noise_std", "blur_sigma", "lesion_strength")


def pooled(splits: list[Split]) -> Split:
    return Split(torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits]))


def auc(labels: torch.Tensor, scores: torch.Tensor) -> float:
    return float(roc_auc_score(labels[:, 0].numpy(), scores.numpy()))


def tiny_densenet() -> torch.nn.Module:
    return DenseNet(
        spatial_dims=2,
        in_channels=1,
        out_channels=1,
        init_features=16,
        growth_rate=8,
        block_config=(2, 2, 2),
    )


def to_input(images: torch.Tensor) -> torch.Tensor:
    return F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)


def train(split: Split, steps: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = tiny_densenet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stream = BatchStream(split, batch_size=32, seed=seed)
    model.train()
    for _ in range(steps):
        x, y = next(stream)
        loss = F.binary_cross_entropy_with_logits(model(to_input(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def scores(model: torch.nn.Module, split: Split) -> torch.Tensor:
    return torch.cat([model(to_input(x)).flatten() for x in split.images.split(256)])


def generation_time() -> None:
    make_synthetic_federation(num_sites=1, scale=0.05)  # warm up torch kernels
    for size in (28, 64):
        start = time.perf_counter()
        sites = make_synthetic_federation(image_size=size)
        images = sum(len(s.train) + len(s.val) + len(s.test) for s in sites)
        print(f"generate 4 sites, {images} images @ {size} px: {time.perf_counter() - start:.2f} s")


def federation(seed: int, test_scale: int) -> list[SiteData]:
    """The default 4-site federation; test splits test_scale times larger for tighter AUCs.

    Train and val splits are identical to the default ones (each split has its own seed).
    """
    profiles = [dataclasses.replace(p, n_test=p.n_test * test_scale) for p in DEFAULT_PROFILES]
    return make_synthetic_federation(seed=seed, profiles=profiles)


def trivial_scores(sites: list[SiteData]) -> None:
    train_set, test = pooled([s.train for s in sites]), pooled([s.test for s in sites])
    mean_auc = auc(test.labels, test.images.mean(dim=(1, 2, 3)))
    per_site = [auc(s.test.labels, s.test.images.mean(dim=(1, 2, 3))) for s in sites]
    regression = LogisticRegression(C=1.0, max_iter=2000)
    regression.fit(train_set.images.flatten(1).numpy(), train_set.labels[:, 0].numpy())
    lr_scores = torch.from_numpy(regression.decision_function(test.images.flatten(1).numpy()))
    print(
        f"  mean-intensity AUC pooled {mean_auc:.3f}, per site "
        + ", ".join(f"{a:.2f}" for a in per_site)
        + f"; logistic regression on pixels {auc(test.labels, lr_scores):.3f}"
    )


def pooled_cnn(sites: list[SiteData], seed: int, steps: int) -> None:
    start = time.perf_counter()
    model = train(pooled([s.train for s in sites]), steps, seed)
    elapsed = time.perf_counter() - start
    test = pooled([s.test for s in sites])
    per_site = ", ".join(f"{s.name} {auc(s.test.labels, scores(model, s.test)):.3f}" for s in sites)
    print(
        f"  pooled DenseNet, {steps} steps ({elapsed:.0f} s): test AUC "
        f"{auc(test.labels, scores(model, test)):.3f} [{per_site}]"
    )


def scanner_shift(seed: int, steps: int, n_test: int = 2000) -> None:
    source, target = DEFAULT_PROFILES[0], DEFAULT_PROFILES[2]
    model = train(make_site(source, seed=seed).train, steps, seed)
    same_scanner = dataclasses.replace(
        target, n_test=n_test, **{f: getattr(source, f) for f in SCANNER_FIELDS}
    )
    own_scanner = dataclasses.replace(target, n_test=n_test)
    home = make_site(dataclasses.replace(source, n_test=n_test), seed=seed + 1000).test
    clean = make_site(same_scanner, seed=seed + 1000).test
    shifted = make_site(own_scanner, seed=seed + 1000).test
    a_home, a_clean, a_shift = (auc(s.labels, scores(model, s)) for s in (home, clean, shifted))
    print(
        f"  trained on {source.name}: its own test {a_home:.3f}; {target.name} patients "
        f"on {source.name}'s scanner {a_clean:.3f}, on {target.name}'s scanner {a_shift:.3f} "
        f"(gap {a_clean - a_shift:+.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--test-scale", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generation_time()
    for seed in args.seeds:
        print(f"seed {seed}")
        sites = federation(seed, args.test_scale)
        trivial_scores(sites)
        pooled_cnn(sites, seed, args.steps)
        scanner_shift(seed, args.steps)
    print(f"numpy {np.__version__}, torch {torch.__version__}, {args.threads} threads")


if __name__ == "__main__":
    main()

"""How hard is the synthetic federation? Prints the numbers the data is tuned to.

1. Generation time (4 default sites at 28 px and 64 px).
2. Trivial scores on the pooled test set: mean pixel intensity (target ~0.5-0.65) and
   logistic regression on raw pixels.
3. A tiny MONAI DenseNet trained on the pooled train sets for --steps SGD steps (BCE, lr 0.1,
   batch 32, input 28 -> 32 px): pooled and per-site test AUC (target ~0.8-0.9, not 1.0).
4. Scanner shift: a model trained on st_elsewhere alone, scored on the same mercy_rural
   patients imaged with st_elsewhere's scanner and with mercy_rural's own; the ceiling is a
   model trained on as many images from mercy_rural's scanner.
5. Multi-label: the same DenseNet with 5 outputs, per-finding test AUC (first seed only).

Test splits are --test-scale times the default size (train/val are unchanged; each split has
its own seed) so the AUCs are tight. Usage:
    python benchmarks/synthetic_difficulty.py [--steps 300] [--seeds 0 1 2]
About 30 s per seed on 2 idle CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F
from monai.networks.nets import DenseNet
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from fed_auc.data.base import SiteData, Split
from fed_auc.data.sampling import BatchStream
from fed_auc.data.synthetic import (
    DEFAULT_PROFILES,
    FINDINGS,
    make_site,
    make_synthetic_federation,
)

SCANNER_FIELDS = ("intensity_shift", "contrast", "noise_std", "blur_sigma", "lesion_strength")


def pooled(splits: list[Split]) -> Split:
    return Split(torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits]))


def auc(split: Split, scores: torch.Tensor, label: int = 0) -> float:
    return float(roc_auc_score(split.labels[:, label].numpy(), scores[:, label].numpy()))


def to_input(images: torch.Tensor) -> torch.Tensor:
    return F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)


def train(split: Split, steps: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = DenseNet(
        spatial_dims=2,
        in_channels=1,
        out_channels=split.num_labels,
        init_features=16,
        growth_rate=8,
        block_config=(2, 2, 2),
    )
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
    return torch.cat([model(to_input(x)) for x in split.images.split(256)])


def federation(seed: int, test_scale: int, num_labels: int = 1) -> list[SiteData]:
    profiles = [dataclasses.replace(p, n_test=p.n_test * test_scale) for p in DEFAULT_PROFILES]
    return make_synthetic_federation(seed=seed, num_labels=num_labels, profiles=profiles)


def generation_time() -> None:
    make_synthetic_federation(num_sites=1, scale=0.05)  # warm up torch kernels
    for size in (28, 64):
        start = time.perf_counter()
        sites = make_synthetic_federation(image_size=size)
        images = sum(len(s.train) + len(s.val) + len(s.test) for s in sites)
        print(f"generate 4 sites, {images} images @ {size} px: {time.perf_counter() - start:.2f} s")


def trivial_scores(sites: list[SiteData]) -> None:
    train_set, test = pooled([s.train for s in sites]), pooled([s.test for s in sites])
    brightness = [s.test.images.mean(dim=(1, 2, 3)).unsqueeze(1) for s in sites]
    per_site = ", ".join(f"{auc(s.test, b):.2f}" for s, b in zip(sites, brightness, strict=True))
    regression = LogisticRegression(C=1.0, max_iter=2000)
    regression.fit(train_set.images.flatten(1).numpy(), train_set.labels[:, 0].numpy())
    pixels = regression.decision_function(test.images.flatten(1).numpy())
    print(
        f"  mean-intensity AUC pooled {auc(test, torch.cat(brightness)):.3f} "
        f"(per site {per_site}); logistic regression on pixels "
        f"{auc(test, torch.from_numpy(pixels).unsqueeze(1)):.3f}"
    )


def pooled_cnn(sites: list[SiteData], seed: int, steps: int) -> None:
    start = time.perf_counter()
    model = train(pooled([s.train for s in sites]), steps, seed)
    elapsed = time.perf_counter() - start
    test = pooled([s.test for s in sites])
    per_site = ", ".join(f"{s.name} {auc(s.test, scores(model, s.test)):.3f}" for s in sites)
    print(
        f"  pooled DenseNet, {steps} steps ({elapsed:.0f} s): test AUC "
        f"{auc(test, scores(model, test)):.3f} [{per_site}]"
    )


def scanner_shift(seed: int, steps: int, n_test: int = 2000) -> None:
    """Same patients, two scanners: the AUC lost is due to the scanner alone."""
    source, target = DEFAULT_PROFILES[0], DEFAULT_PROFILES[2]
    scanner = {f: getattr(target, f) for f in SCANNER_FIELDS}
    model = train(make_site(source, seed=seed).train, steps, seed)
    ceiling = train(make_site(dataclasses.replace(source, **scanner), seed=seed).train, steps, seed)
    home = {f: getattr(source, f) for f in SCANNER_FIELDS}
    clean = make_site(dataclasses.replace(target, n_test=n_test, **home), seed=seed + 1).test
    shifted = make_site(dataclasses.replace(target, n_test=n_test), seed=seed + 1).test
    a_clean, a_shift = auc(clean, scores(model, clean)), auc(shifted, scores(model, shifted))
    print(
        f"  trained on {source.name}: {target.name} patients on {source.name}'s scanner "
        f"{a_clean:.3f}, on {target.name}'s scanner {a_shift:.3f} (gap {a_clean - a_shift:+.3f}); "
        f"trained on {target.name}'s scanner: {auc(shifted, scores(ceiling, shifted)):.3f}"
    )


def multilabel(seed: int, steps: int, test_scale: int) -> None:
    sites = federation(seed, test_scale, num_labels=len(FINDINGS))
    model = train(pooled([s.train for s in sites]), steps, seed)
    test = pooled([s.test for s in sites])
    predicted = scores(model, test)
    brightness = test.images.mean(dim=(1, 2, 3)).unsqueeze(1).expand(-1, len(FINDINGS))
    per_label = ", ".join(
        f"{name} {auc(test, predicted, j):.3f} (mean-intensity {auc(test, brightness, j):.2f})"
        for j, name in enumerate(FINDINGS)
    )
    print(f"multi-label DenseNet, {steps} steps, seed {seed}: {per_label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--multilabel-steps", type=int, default=1000)
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
    multilabel(args.seeds[0], args.multilabel_steps, args.test_scale)
    print(f"torch {torch.__version__}, {args.threads} threads")


if __name__ == "__main__":
    main()

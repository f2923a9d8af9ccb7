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
its own seed) so the AUCs are tight. About 30 s per seed on 2 idle CPU cores. On a loaded
machine run it with OMP_NUM_THREADS=1: two torch threads that wait for each other are far slower.

    python -m benchmarks.systems.synthetic_difficulty --quick
    python -m benchmarks.systems.synthetic_difficulty \\
        --markdown benchmarks/results/synthetic_difficulty.md
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from monai.networks.nets import DenseNet
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from benchmarks.common.fragment import emit, provenance
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
        x, y, _ = next(stream)
        loss = F.binary_cross_entropy_with_logits(model(to_input(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def scores(model: torch.nn.Module, split: Split) -> torch.Tensor:
    return torch.cat([model(to_input(x)) for x in split.images.split(256)])


def federation(
    seed: int, test_scale: int, num_labels: int = 1, scale: float = 1.0
) -> list[SiteData]:
    profiles = [dataclasses.replace(p, n_test=p.n_test * test_scale) for p in DEFAULT_PROFILES]
    return make_synthetic_federation(
        seed=seed, num_labels=num_labels, profiles=profiles, scale=scale
    )


def generation_time() -> dict[int, tuple[int, float]]:
    """Image size → (images, seconds) to generate the 4 default sites."""
    make_synthetic_federation(num_sites=1, scale=0.05)  # warm up torch kernels
    out = {}
    for size in (28, 64):
        start = time.perf_counter()
        sites = make_synthetic_federation(image_size=size)
        images = sum(len(s.train) + len(s.val) + len(s.test) for s in sites)
        out[size] = (images, time.perf_counter() - start)
    return out


def trivial_scores(sites: list[SiteData]) -> dict[str, float]:
    """Pooled test AUC of mean pixel intensity and of logistic regression on raw pixels."""
    train_set, test = pooled([s.train for s in sites]), pooled([s.test for s in sites])
    brightness = test.images.mean(dim=(1, 2, 3)).unsqueeze(1)
    regression = LogisticRegression(C=1.0, max_iter=2000)
    regression.fit(train_set.images.flatten(1).numpy(), train_set.labels[:, 0].numpy())
    pixels = regression.decision_function(test.images.flatten(1).numpy())
    return {
        "intensity": auc(test, brightness),
        "logistic": auc(test, torch.from_numpy(pixels).unsqueeze(1)),
    }


def pooled_cnn(sites: list[SiteData], seed: int, steps: int) -> dict[str, float]:
    """Test AUC of a DenseNet trained on the pooled train sets: 'pooled' and per site."""
    model = train(pooled([s.train for s in sites]), steps, seed)
    test = pooled([s.test for s in sites])
    return {"pooled": auc(test, scores(model, test))} | {
        s.name: auc(s.test, scores(model, s.test)) for s in sites
    }


def scanner_shift(seed: int, steps: int, n_test: int = 2000) -> dict[str, float]:
    """Same patients, two scanners: the AUC lost is due to the scanner alone.

    'home': target patients on the source's scanner; 'shifted': on their own scanner;
    'ceiling': a model trained on as many images from the target's scanner, same test.
    """
    source, target = DEFAULT_PROFILES[0], DEFAULT_PROFILES[2]
    scanner = {f: getattr(target, f) for f in SCANNER_FIELDS}
    model = train(make_site(source, seed=seed).train, steps, seed)
    ceiling = train(make_site(dataclasses.replace(source, **scanner), seed=seed).train, steps, seed)
    home = {f: getattr(source, f) for f in SCANNER_FIELDS}
    clean = make_site(dataclasses.replace(target, n_test=n_test, **home), seed=seed + 1).test
    shifted = make_site(dataclasses.replace(target, n_test=n_test), seed=seed + 1).test
    return {
        "home": auc(clean, scores(model, clean)),
        "shifted": auc(shifted, scores(model, shifted)),
        "ceiling": auc(shifted, scores(ceiling, shifted)),
    }


def multilabel(seed: int, steps: int, test_scale: int, scale: float = 1.0) -> dict[str, float]:
    """Finding → pooled test AUC of one DenseNet with an output per finding."""
    sites = federation(seed, test_scale, num_labels=len(FINDINGS), scale=scale)
    model = train(pooled([s.train for s in sites]), steps, seed)
    test = pooled([s.test for s in sites])
    predicted = scores(model, test)
    return {name: auc(test, predicted, j) for j, name in enumerate(FINDINGS)}


def per_seed(seeds: list[int], steps: int, test_scale: int, scale: float = 1.0) -> dict:
    """Seed → every single-label measure of that seed's federation."""
    out = {}
    for seed in seeds:
        sites = federation(seed, test_scale, scale=scale)
        out[seed] = {
            **trivial_scores(sites),
            "cnn": pooled_cnn(sites, seed, steps),
            "shift": scanner_shift(seed, steps, n_test=max(200, int(2000 * scale))),
        }
        print(f"seed {seed}: {out[seed]}", flush=True)
    return out


def table(
    results: dict, steps: int, multi: dict[str, float], multi_steps: int, generation: dict
) -> str:
    """The Markdown table: one cell per measure, seeds separated by ' / ' (or ', ')."""
    runs = list(results.values())
    sites = [name for name in runs[0]["cnn"] if name != "pooled"]
    source, target = DEFAULT_PROFILES[0].name, DEFAULT_PROFILES[2].name

    def seeds(value) -> str:
        return " / ".join(f"{value(r):.3f}" for r in runs)

    def spread(name: str) -> str:
        low, high = (f"{f(r['cnn'][name] for r in runs):.3f}" for f in (min, max))
        return f"{name} {low}" if low == high else f"{name} {low}–{high}"

    shift = ", ".join(f"{r['shift']['home']:.3f} → {r['shift']['shifted']:.3f}" for r in runs)
    made = " / ".join(f"{seconds:.2f} s" for _, seconds in generation.values())
    sizes = " / ".join(f"{size} px" for size in generation)
    rows = [
        ("mean pixel intensity as the score, pooled test AUC", seeds(lambda r: r["intensity"])),
        ("logistic regression on raw pixels", seeds(lambda r: r["logistic"])),
        (
            f"tiny DenseNet, pooled training, {steps} steps × 32, BCE, SGD 0.1",
            seeds(lambda r: r["cnn"]["pooled"]),
        ),
        ("same, per site (lowest–highest over seeds)", ", ".join(map(spread, sites))),
        (
            f"trained on {source}, tested on {target} patients imaged with {source}'s scanner "
            f"→ with {target}'s own",
            shift,
        ),
        (
            f"trained on as many images from {target}'s scanner (ceiling), same test",
            seeds(lambda r: r["shift"]["ceiling"]),
        ),
        (
            f"multi-label ({len(multi)} findings), {multi_steps} steps, first seed",
            ", ".join(f"{name} {value:.3f}" for name, value in multi.items()),
        ),
        (
            f"generating 4 sites ({next(iter(generation.values()))[0]:,} images), {sizes}",
            made,
        ),
    ]
    lines = ["| measure | result |", "|---|---|"]
    return "\n".join(lines + [f"| {measure} | {result} |" for measure, result in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0, fewer steps, 2× test")
    parser.add_argument("--steps", type=int, help="training steps (full: 300, quick: 150)")
    parser.add_argument("--multilabel-steps", type=int, help="(full: 1000, quick: 300)")
    parser.add_argument("--seeds", type=int, nargs="+", help="(full: 0 1 2, quick: 0)")
    parser.add_argument("--test-scale", type=int, help="(full: 5, quick: 2)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--markdown", type=Path, help="write the table to this file")
    args = parser.parse_args()
    steps = args.steps or (150 if args.quick else 300)
    multi_steps = args.multilabel_steps or (300 if args.quick else 1000)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    test_scale = args.test_scale or (2 if args.quick else 5)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    generation = generation_time()
    results = per_seed(seeds, steps, test_scale)
    multi = multilabel(seeds[0], multi_steps, test_scale)
    settings = (
        f"Test splits {test_scale}× the default size; each result lists the seeds in order; "
        "generation time is wall time on this loaded machine."
    )
    text = table(results, steps, multi, multi_steps, generation)
    seed_list = " / ".join(map(str, seeds))
    emit(
        f"{provenance(seed_list, time.perf_counter() - started, settings)}\n\n{text}", args.markdown
    )


if __name__ == "__main__":
    main()

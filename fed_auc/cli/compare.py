"""``fed-auc runs --compare A B``: two runs' exported models on the same sites' test images, each
site's AUC difference (and the pooled one) with DeLong's paired 95 % interval, printed and
recorded in the run store for the dashboard's Compare page.

The test images are loaded here as the runs loaded them: a run on ``--data`` from its
``partition.json`` (exactly its sites), the synthetic federation and site files from the
recorded config, so a clinician or operator chooses between two runs with evidence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fed_auc.data.base import Split
from fed_auc.metrics.paired import FIXED_EFFECT

PREFIX = "fed-auc runs --compare"


def compare_command(runs_dir: str, run_a: str, run_b: str, as_json: bool) -> None:
    """Compute, record and print the comparison; a one-line SystemExit on any refusal."""
    try:
        about, rows = compare_runs(runs_dir, run_a, run_b)
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"{PREFIX}: {exc.args[0] if exc.args else exc}") from None
    if as_json:
        print(json.dumps({**about, "rows": rows}, indent=2))
        return
    for line in comparison_lines(about, rows):
        print(line)


def compare_runs(
    runs_dir: str, run_a: str, run_b: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What was compared (runs, split, sites, positive class) and the rows recorded."""
    from fed_auc.evaluate.compare import (
        SPLIT,
        check_cards,
        check_comparable,
        compare_models,
        model_dir,
    )
    from fed_auc.registry.load import load_registered_model
    from fed_auc.store.run_store import STORE_FILE, RunStore

    if not (Path(runs_dir) / STORE_FILE).exists():
        raise ValueError(f"no run store in {runs_dir!r} (expected {STORE_FILE})")
    with RunStore(runs_dir) as store:
        runs = store.run(run_a), store.run(run_b)
    check_comparable(runs_dir, *runs)
    loaded = [load_registered_model(model_dir(runs_dir, r["id"])) for r in runs]
    models, cards = (loaded[0][0], loaded[1][0]), (loaded[0][1], loaded[1][1])
    check_cards(cards, (run_a, run_b))
    sites = site_test_splits(runs_dir, runs[0])
    rows = compare_models(models, cards, sites)
    with RunStore(runs_dir) as store:
        store.record_comparison(run_a, run_b, SPLIT, rows)
    about = {
        "run_a": {"id": run_a, "algorithm": runs[0]["algorithm"]},
        "run_b": {"id": run_b, "algorithm": runs[1]["algorithm"]},
        "split": SPLIT,
        "sites": sorted(sites),
        "label_names": list(cards[0]["label_names"]),
        "positive_class": [r["positive_class"] for r in rows[: len(cards[0]["label_names"])]],
        "method": rows[0]["method"] if rows else None,
        "level": rows[0]["level"] if rows else None,
    }
    return about, rows


def site_test_splits(runs_dir: str, run: dict[str, Any]) -> dict[str, Split]:
    """Each site's test split, as the run loaded its sites: a ``--data`` run's partition
    manifest, else its recorded config (the synthetic federation, or its site files)."""
    import dataclasses

    from fed_auc.data.partition import PARTITION_FILE, sites_from_manifest
    from fed_auc.data.spec import load_pool, parse_data_spec
    from fed_auc.experiment.files import recorded_config
    from fed_auc.simulation import load_in_process_sites

    config = recorded_config(run["config"], runs_dir)
    manifest = Path(runs_dir) / run["id"] / PARTITION_FILE
    if manifest.is_file():
        pool = load_pool(parse_data_spec(config.data), config.image_size, config.data_reading())
        sites = sites_from_manifest(pool, json.loads(manifest.read_text()))
    else:  # scored on the CPU here, whatever device the run trained on
        config = dataclasses.replace(config, device="cpu", precision="fp32")
        sites = [s.data for s in load_in_process_sites(config)[0]]
    return {s.name: s.test for s in sites}


def comparison_lines(about: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """A header naming both runs, the split, the sites and the positive class; then a line
    per site and label, the pooled one (or, over a federation, the combined one) last."""
    from fed_auc.metrics.wording import class_text

    a, b = about["run_a"], about["run_b"]
    sites = about["sites"]
    lines = [
        f"A = {a['algorithm']} run {a['id']}, B = {b['algorithm']} run {b['id']}: exported "
        f"models on the {about['split']} split of {len(sites)} site(s) ({', '.join(sites)}), "
        f"positive class {class_text(about['positive_class'])}"
    ]
    many = len(about["label_names"]) > 1
    for row in rows:
        where = row["site"] if row["site"] in ("pooled", FIXED_EFFECT) else f"site {row['site']}"
        label = f" [{row['label']}]" if many else ""
        lines.append(f"{where}{label}: {row_text(row)}")
    return lines


def row_text(row: dict[str, Any]) -> str:
    """``AUC A 0.812 vs B 0.790, difference +0.022 [-0.010, +0.054] (DeLong, 95 %, paired on
    156 test images, 42 positive: malignant)``."""
    on = f"paired on {row['n']} test images, {row['positives']} positive: {row['positive_class']}"
    if row["site"] == FIXED_EFFECT and row["difference"] is not None:  # no pooled AUC: none met
        level = f"{100 * row['level']:g} %"
        return (f"difference {row['difference']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}] "
                f"({row['method']}, {level}, {row['reason']}; {on})")  # fmt: skip
    if row["auc_a"] is None:
        return f"{row['reason']} ({on})"
    text = f"AUC A {row['auc_a']:.3f} vs B {row['auc_b']:.3f}, difference {row['difference']:+.3f}"
    if row["lo"] is None:
        return f"{text}; {row['reason']} ({on})"
    level = f"{100 * row['level']:g} %"
    return f"{text} [{row['lo']:+.3f}, {row['hi']:+.3f}] ({row['method']}, {level}, {on})"

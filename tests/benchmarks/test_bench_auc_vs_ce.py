"""benchmarks/rare_positives/auc_vs_ce.py and auc_causes.py: the commands they run and the tables
they print."""

from __future__ import annotations

import json
import math
import statistics

from benchmarks.rare_positives import auc_causes
from benchmarks.rare_positives import auc_vs_ce as bench


def test_every_contender_shares_the_federation_seed_and_recipe(tmp_path):
    commands = {arm: bench.command("breast_5", arm, 3, tmp_path) for arm in bench.ARMS}
    base = [a for a in commands[bench.BASELINE] if a not in bench.ARMS[bench.BASELINE]]
    for arm, cmd in commands.items():
        auc = bench.arm_recipe("breast_5", arm)
        shared = [a for a in cmd if a not in bench.ARMS[arm] and a not in auc]
        assert shared == base, arm
        paper = arm in bench.WITHOUT_AUC_RECIPE
        own_rule = arm in bench.OWN_DUAL_STEP  # their α step is their own: no dual_lr
        assert ("dual_lr=prevalence" in cmd) != (paper or own_rule), arm
        assert ("recenter" in cmd) != paper, arm
        assert cmd[cmd.index("--seed") + 1] == "3"
        assert cmd[cmd.index("--positive-label") + 1] == "0"
        assert cmd[cmd.index("--partition") + 1] == "imratio:0.05,0.05,0.05,0.05"
    paper_step = commands["CODASCA, paper's α step"]
    assert paper_step[paper_step.index("--warmup-head") + 1] == "keep"
    assert paper_step[paper_step.index("--backend-option") + 1] == "dual_lr=0.8"  # = its lr
    assert "--loss" not in commands[bench.BASELINE]  # fedavg's own default: cross-entropy
    synthetic = bench.command("synthetic_rare", "CODASCA", 0, tmp_path, quick=True)
    assert "--positive-label" not in synthetic and "--data" not in synthetic
    assert "--warmup-head" not in synthetic and "dual_lr=prevalence" in synthetic  # no warm-up
    assert bench.federation_partition("breast_2") == "imratio:0.01,0.02,0.01,0.02"


def test_a_changed_option_comes_after_the_recipe_so_it_wins(tmp_path):
    extra = auc_causes.SCREENED + auc_causes.VARIANTS["lr 0.1"]
    cmd = bench.command("breast_5", "CODASCA", 0, tmp_path, extra=extra)
    lrs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--lr"]
    assert lrs == ["0.8", "0.2", "0.1"]  # the recipe's, the screen's, the variant's: last wins


def test_the_current_recipe_screens_codasca_with_the_image_file_defaults(tmp_path):
    base, arm = auc_causes.RECIPES["current"]
    cmd = bench.command("breast_5", arm, 0, tmp_path, extra=base)
    assert cmd[cmd.index("--algorithm") + 1] == "codasca"
    assert "dual_lr=prevalence" in cmd and "recenter" in cmd
    no_warmup = bench.command("breast_5", arm, 0, tmp_path,
                              extra=base + auc_causes.VARIANTS["warm-up 0 rounds"])  # fmt: skip
    heads = [no_warmup[i + 1] for i, a in enumerate(no_warmup) if a == "--warmup-head"]
    warmups = [no_warmup[i + 1] for i, a in enumerate(no_warmup) if a == "--warmup-rounds"]
    assert heads[-1] == "keep" and warmups[-1] == "0"  # recentering needs a warm-up


def test_paired_interval_matches_a_t_interval_and_brackets_the_mean():
    diffs = [0.03, 0.01, 0.04, -0.01, 0.02]
    mean, lo, hi = bench.paired_ci(diffs)
    half = 2.7764451 * statistics.stdev(diffs) / math.sqrt(5)  # t(0.975, 4)
    assert math.isclose(mean, 0.018) and math.isclose(hi - mean, half, rel_tol=1e-7)
    assert lo < mean < hi
    assert bench.paired_ci([0.02, 0.02]) == (0.02, 0.02, 0.02)


def _runs(values):
    return {s: {"val_auc": v, "test_auc": v, "seconds": 60.0, "load": 3.0} for s, v in values}


def test_table_pairs_each_contender_with_fedavg_ce_seed_by_seed():
    results = {
        bench.BASELINE: _runs([(0, 0.80), (1, 0.70), (2, 0.90)]),
        "CODASCA": _runs([(0, 0.83), (1, 0.71), (2, 0.89)]),
        "CODA+": _runs([(0, 0.85), (2, 0.95)]),
    }
    text = bench.table("t", results)
    codasca = next(line for line in text.splitlines() if line.startswith("| CODASCA"))
    assert "+0.010 [" in codasca and "2 of 3" in codasca and "0.830, 0.710, 0.890" in codasca
    coda = next(line for line in text.splitlines() if line.startswith("| CODA+"))
    assert "+0.050 [+0.050, +0.050]" in coda  # seeds 0 and 2 only, both +0.05
    section = bench.fragment_section("breast_5", results, False, [])
    assert "8 runs, 8 run-minutes" in section and "load average (1 min) 3.0–3.0" in section
    assert "(Fed-Norm-SGDA+" not in section
    results["Fed-Norm-SGDA+"] = _runs([(0, 0.81)])
    section = bench.fragment_section("breast_5", results, False, [])
    assert "dual_lr=prevalence` (Fed-Norm-SGDA+: `--warmup-head recenter`)" in section


def test_causes_table_gives_the_validation_difference_to_the_recipe():
    results = {
        auc_causes.BASE: _runs([(0, 0.9), (1, 0.8)]),
        "lr 0.1": _runs([(0, 0.92), (1, 0.82)]),
    }
    row = auc_causes.table(results).splitlines()[-1]
    assert row.startswith("| lr 0.1 | 0.870 ± 0.071 | +0.020 [+0.020, +0.020]")


def test_from_json_merges_runs_by_federation_contender_and_seed(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"breast_5": {bench.BASELINE: _runs([(0, 0.8)])}}))
    second.write_text(
        json.dumps(
            {"breast_5": {bench.BASELINE: _runs([(1, 0.7)]), bench.LIBAUC: _runs([(0, 0.9)])}}
        )
    )
    out = bench.merged([first, second])["breast_5"]
    assert sorted(out[bench.BASELINE]) == [0, 1] and list(out[bench.LIBAUC]) == [0]


def test_the_centralized_reference_pools_exactly_the_federations_training_images(tmp_path):
    import numpy as np

    from benchmarks.anchors import libauc_central
    from tests.support.data_files import write_npz

    path = write_npz(tmp_path / "m.npz", n=(200, 40, 40))
    data = libauc_central.pooled_splits(path, "imratio:0.1,0.1,0.1,0.1", seed=0)
    raw = np.load(path)
    malignant = int((raw["train_labels"][:, 0] == 0).sum())
    positives, n = int(data.train[1].sum()), len(data.train[1])
    assert 0 < positives < malignant and positives / n <= 0.1  # cut to the sites' imratio
    assert len(data.val[1]) == 40 and int(data.test[1].sum()) == int(
        (raw["test_labels"] == 0).sum()
    )

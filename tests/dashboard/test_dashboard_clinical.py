"""What a clinician reads, checked against the store and independent references: the ROC
page of the exported model starts at the card's threshold, operating-point figures match
counts recomputed from the stored bins (sklearn on the binned scores), heat-maps keep one
labelled row per site at 3 and 32 sites."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.metrics import roc_curve
from streamlit.testing.v1 import AppTest

from app.charts import ROW_PX
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page
from tests.support.dashboard_store import (
    EXPORTED_ROUND,
    SITES,
    THRESHOLD,
    fill,
    fill_sized,
    split_of,
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


def stored_bins(runs_dir) -> dict[str, dict]:
    with RunStore(runs_dir) as store:
        rows = store.model_evaluations("run-complete")
    return {
        site: json.loads(labels)[0]["bins"]
        for site, labels in zip(rows["site"], rows["labels"], strict=True)
    }


def binned_scores(bins: dict) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores rebuilt from the counts: each image at its bin's left edge."""
    edges = np.asarray(bins["edges"][:-1])
    pos = np.repeat(edges, np.asarray(bins["positives"], dtype=int))
    neg = np.repeat(edges, np.asarray(bins["negatives"], dtype=int))
    return np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]


def sensitivity_at(labels: np.ndarray, scores: np.ndarray, target: float) -> float:
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return float(tpr[(1 - fpr) >= target - 1e-12].max())


def test_roc_of_the_exported_model_starts_at_the_cards_threshold(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "roc", "run-complete")
    slider = at.select_slider(key="roc_threshold")
    assert slider.value == pytest.approx(THRESHOLD, abs=1e-12)
    assert f"At threshold {THRESHOLD:.3f}" in [s.value for s in at.subheader]
    table = at.dataframe[0].value.set_index("site")
    for site in SITES:  # the export is round 1's model: its raw scores, counted directly
        labels, scores = split_of(site, EXPORTED_ROUND)
        called = scores >= THRESHOLD
        if labels.sum():
            assert table.loc[site, "sensitivity"] == pytest.approx(called[labels == 1].mean())
        assert table.loc[site, "specificity"] == pytest.approx((~called[labels == 0]).mean())
        assert table.loc[site, "positives"] == labels.sum()
    assert "ROC undefined" in table.loc["east", "note"]

    at.number_input(key="roc_target_specificity").set_value(0.9).run()
    at.button(key="roc_set").click().run()
    moved = at.select_slider(key="roc_threshold").value
    labels = np.concatenate([split_of(s, EXPORTED_ROUND)[0] for s in SITES])
    scores = np.concatenate([split_of(s, EXPORTED_ROUND)[1] for s in SITES])
    assert (scores[labels == 0] < moved).mean() >= 0.9
    assert (scores[labels == 0] < moved - 0.001).mean() < 0.9  # the lowest edge that reaches it


def test_sensitivity_at_90_specificity_equals_one_computed_from_the_stored_bins(
    monkeypatch, store_dir
):
    at = open_page(monkeypatch, store_dir, "operating_point", "run-complete")
    parts = [d.value.set_index("site") for d in at.dataframe]  # three tables, one per theme
    assert len(parts) == 3 and all(len(p.columns) <= 6 for p in parts)
    table = pd.concat(parts, axis=1)
    bins = stored_bins(store_dir)
    for site in ("north", "south", "west"):
        labels, scores = binned_scores(bins[site])
        expected = sensitivity_at(labels, scores, 0.9)
        cell = table.loc[site, "sensitivity @ 90 % spec. (95 % CI)"]
        assert cell.startswith(f"{expected:.3f} (")
        assert table.loc[site, "positives"] == labels.sum()
        assert table.loc[site, "negatives"] == (labels == 0).sum()
    both = [binned_scores(bins[s]) for s in SITES]
    pooled = sensitivity_at(np.concatenate([y for y, _ in both]),
                            np.concatenate([s for _, s in both]), 0.95)  # fmt: skip
    assert table.loc["pooled", "sensitivity @ 95 % spec. (95 % CI)"].startswith(f"{pooled:.3f} (")
    assert table.loc["east", "sensitivity @ 90 % spec. (95 % CI)"] == "n/a"
    # PPV at the card's threshold, from the raw scores of the exported round
    labels, scores = split_of("north", EXPORTED_ROUND)
    ppv = labels[scores >= THRESHOLD].mean()
    assert table.loc["north", "PPV (95 % CI)"].startswith(f"{ppv:.3f} (")
    assert any("Brier score" in c.value for c in at.caption)


def charts_of(at: AppTest) -> list:
    def walk(node):
        yield node
        for child in getattr(node, "children", {}).values():
            yield from walk(child)

    return [e.proto for e in walk(at._tree) if getattr(e, "type", "") == "vega_lite_chart"]


def chart_data(proto):
    return pa.ipc.open_stream(proto.datasets[0].data.data).read_all().to_pandas()


@pytest.mark.parametrize("n_sites", [3, 32])
def test_heat_maps_have_one_labelled_row_per_site(monkeypatch, tmp_path, n_sites):
    run_id = fill_sized(tmp_path, n_sites)
    for page, title in (("participation", "status"), ("heterogeneity", "similarity (1 = alike)")):
        at = open_page(monkeypatch, tmp_path, page, run_id)
        maps = [
            c
            for c in charts_of(at)
            if json.loads(c.spec).get("mark", {}) in ("rect", {"type": "rect"})
        ]
        assert maps, page
        for proto in maps:
            spec = json.loads(proto.spec)
            y = spec["encoding"]["y"]
            assert y["field"] == "site" and y["axis"]["labelOverlap"] is False
            assert spec["height"] >= ROW_PX * n_sites
            assert chart_data(proto)["site"].nunique() == n_sites
            assert spec["encoding"]["x"]["title"]  # every axis says what it counts
        assert any(json.loads(c.spec)["encoding"]["color"]["title"] == title for c in maps), page

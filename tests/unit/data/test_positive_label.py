"""--positive-label: which label value of a file is the positive class, and imratio in cards."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from fed_auc.cli import main
from fed_auc.data.csv_images import load_csv_images
from fed_auc.data.medmnist import load_medmnist
from fed_auc.data.reading import DataReading
from fed_auc.data.spec import load_sites
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import build_model, group_of
from fed_auc.run.warmup import recenter_classifier, reset_classifier
from fed_auc.site import SiteDefinition
from fed_auc.trainable import BUFFER, WEIGHT
from tests.support.data_files import write_chexpert, write_npz, write_png


def test_positive_label_zero_makes_the_files_zeros_the_positives(tmp_path):
    path = write_npz(tmp_path / "m.npz")
    raw = np.load(path)
    pool = load_medmnist(path, positive_label=0)
    expected = np.concatenate([raw[f"{s}_labels"][:, 0] == 0 for s in ("train", "val", "test")])
    assert pool.labels[:, 0].numpy().tolist() == expected.astype(float).tolist()
    assert "label value 0" in pool.meta["positive_label"]
    assert "positive_label" not in load_medmnist(path).meta


def test_a_multiclass_npz_becomes_one_class_against_the_rest(tmp_path):
    path = write_npz(tmp_path / "m.npz")
    arrays = dict(np.load(path))
    for split in ("train", "val", "test"):
        arrays[f"{split}_labels"] = (np.arange(len(arrays[f"{split}_labels"])) % 4)[:, None]
    np.savez(path, **arrays)
    pool = load_medmnist(path, positive_label=2, classes=4)
    classes = np.concatenate([arrays[f"{s}_labels"][:, 0] for s in ("train", "val", "test")])
    assert pool.labels[:, 0].numpy().tolist() == (classes == 2).astype(float).tolist()
    with pytest.raises(ValueError, match=r"m\.npz: positive_label 7 does not .*\[0, 1, 2, 3\]"):
        load_medmnist(path, positive_label=7, classes=8)
    with pytest.raises(ValueError, match=r"train_labels row 3 .* value 3 .*must be 0 … 2"):
        load_medmnist(path, positive_label=2, classes=3)  # more classes than it says
    with pytest.raises(ValueError, match="train_labels row 2 .* value 2 .*must be 0 or 1"):
        load_medmnist(path, positive_label=2)  # undeclared, as a stray value in a binary file


def _stray_label(path, split: str = "train", row: int = 5, value: int = 2):
    """A binary npz with one stray ``value`` at ``split``'s ``row``."""
    arrays = dict(np.load(write_npz(path)))
    arrays[f"{split}_labels"][row, 0] = value
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("positive", [None, 0], ids=["file's 1", "positive_label 0"])
def test_a_stray_label_in_a_binary_npz_is_refused_by_node_check(tmp_path, positive):
    """With or without positive_label, a 2 in a 0/1 file stops ``fed-auc node --check``
    (it used to become a negative with positive_label, and the node said "ready")."""
    _stray_label(tmp_path / "m.npz")
    site = tmp_path / "north.toml"
    chosen = "" if positive is None else f"positive_label = {positive}\n"
    site.write_text(f'name = "north"\n[data]\nspec = "medmnist:m.npz"\n{chosen}')
    with pytest.raises(SystemExit) as refused:
        main(["node", "--site", str(site), "--check", "--image-size", "16"])
    said = str(refused.value.code)
    assert said.startswith(f"fed-auc node: {site}: ")
    assert f"{tmp_path / 'm.npz'}: train_labels row 5 column 0" in said
    assert "has value 2 (1 such row(s) in train)" in said and "must be 0 or 1" in said
    assert "classes" in said  # how a real multi-class file is given


def test_a_stray_label_is_refused_in_process_and_a_declared_class_count_accepted(tmp_path):
    path = _stray_label(tmp_path / "m.npz", "test", 2)
    with pytest.raises(ValueError, match=r"m\.npz: test_labels row 2 column 0 has value 2"):
        load_sites(f"medmnist:{path}", None, 2, 0, 16, reading=DataReading(positive_label=0))
    sites, _ = load_sites(
        f"medmnist:{path}", None, 2, 0, 16, reading=DataReading(positive_label=0, classes=3)
    )
    assert sum(s.test.positives()[0] for s in sites) == int(
        (np.load(path)["test_labels"] == 0).sum()
    )


def test_a_stray_label_in_a_csv_is_refused_with_positive_label(tmp_path):
    path = _label_csv(tmp_path, ["0", "1", "2", "1", "0", "1"])
    with pytest.raises(ValueError, match=r"labels\.csv line 4, column 'label': label '2' is not"):
        load_csv_images(path, image_size=16, reading=DataReading(positive_label=0))


def test_classes_is_checked_where_it_is_given(tmp_path):
    npz = write_npz(tmp_path / "m.npz")
    with pytest.raises(ValueError, match="classes = 3: a multi-class column needs positive_label"):
        ExperimentConfig(data=f"medmnist:{npz}", classes=3)
    with pytest.raises(ValueError, match="classes must be the number of classes .* got 1"):
        ExperimentConfig(data=f"medmnist:{npz}", positive_label=0, classes=1)
    site = tmp_path / "north.toml"
    site.write_text('name = "north"\n[data]\nspec = "medmnist:m.npz"\nclasses = "9"\n')
    with pytest.raises(ValueError, match=r"north\.toml: \[data\] classes must be"):
        SiteDefinition.from_toml(site)
    csv_path = _label_csv(tmp_path, ["0", "1", "1", "0"])
    with pytest.raises(ValueError, match="classes = 3 applies to .npz files"):
        reading = DataReading(positive_label=0, classes=3)
        load_sites(f"csv:{csv_path}", None, 1, 0, 16, reading=reading)


@pytest.mark.parametrize("bad", [-1, True, "0", 0.5])
def test_a_bad_positive_label_is_refused_before_anything_runs(tmp_path, bad):
    path = write_npz(tmp_path / "m.npz")
    with pytest.raises(ValueError, match=f"positive_label must be .*got {bad!r}"):
        ExperimentConfig(data=f"medmnist:{path}", positive_label=bad)


def test_positive_label_on_the_synthetic_federation_is_refused():
    with pytest.raises(ValueError, match="positive_label 0 applies to file sources"):
        ExperimentConfig(positive_label=0)
    with pytest.raises(ValueError, match="applies to file sources"):
        load_sites("synthetic", None, 2, 0, 16, reading=DataReading(positive_label=0))


def _label_csv(root, labels):
    rows = []
    for i, label in enumerate(labels):
        write_png(root / f"img{i}.png", 150 if label == "0" else 90, seed=i)
        rows.append({"path": f"img{i}.png", "label": label})
    path = root / "labels.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["path", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_csv_positive_label_zero_swaps_the_classes_and_keeps_unknowns(tmp_path):
    path = _label_csv(tmp_path, ["0", "1", "", "1", "0", "-1"])
    plain = load_csv_images(path, image_size=16, reading=DataReading(uncertain="ignore"))
    swapped = load_csv_images(
        path, image_size=16, reading=DataReading(uncertain="ignore", positive_label=0)
    )
    known = ~torch.isnan(plain.labels)
    assert torch.equal(torch.isnan(swapped.labels), ~known)
    assert torch.equal(swapped.labels[known], 1 - plain.labels[known])
    with pytest.raises(ValueError, match=r"labels\.csv: positive_label 2 is not a label"):
        load_csv_images(path, image_size=16, reading=DataReading(positive_label=2))


def test_csv_with_several_label_columns_refuses_a_positive_label(tmp_path):
    path = write_chexpert(tmp_path, per_site=4)
    with pytest.raises(ValueError, match="needs one label column, the file has 5"):
        load_csv_images(path, image_size=16, reading=DataReading(positive_label=0))


def test_data_cards_name_the_positive_class_and_each_sites_imratio(tmp_path):
    path = write_npz(tmp_path / "m.npz", n=(200, 40, 40))
    out = tmp_path / "cards"
    main(["data-card", "--data", f"medmnist:{path}", "--positive-label", "0", "--sites", "2",
          "--partition", "imratio:0.1,0.25", "--out", str(out)])  # fmt: skip
    for site, ratio in (("site0", 0.1), ("site1", 0.25)):
        card = json.loads((out / f"{site}.json").read_text())
        assert card["details"]["imratio"] == ratio
        assert "label value 0" in card["details"]["positive_label"]
        train = card["splits"]["train"]
        # _impose_ratio keeps floor(r·neg/(1−r)) positives: the ratio from below, within one
        assert train["positives"][0] / train["n"] <= ratio + 1e-9
        assert (train["positives"][0] + 1) / (train["n"] + 1) > ratio
        assert "label value 0" in (out / f"{site}.md").read_text()


def test_a_site_file_with_a_bad_positive_label_names_the_file(tmp_path):
    write_npz(tmp_path / "m.npz")
    site = tmp_path / "north.toml"
    site.write_text('name = "north"\n[data]\nspec = "medmnist:m.npz"\npositive_label = "x"\n')
    with pytest.raises(ValueError, match=r"north\.toml: \[data\] positive_label must be"):
        SiteDefinition.from_toml(site)
    site.write_text('name = "north"\n[data]\nspec = "medmnist:m.npz"\npositive_label = 0\n')
    data = SiteDefinition.from_toml(site).load(16, 1, 0)
    raw = np.load(tmp_path / "m.npz")
    assert data.test.positives() == [int((raw["test_labels"][:, 0] == 0).sum())]


def test_reset_classifier_restores_only_the_output_layer():
    initial = build_model("tiny")
    trained = {f"{WEIGHT}{k}": v + 1.0 for k, v in initial.named_parameters()}
    trained |= {f"{BUFFER}{k}": v.clone() for k, v in initial.named_buffers()}
    out = reset_classifier(trained, initial)
    state = initial.state_dict()
    heads = [name for name in out if group_of(name.split("/", 1)[1]) == "classifier"]
    assert heads and set(out) == set(trained)
    for name, tensor in out.items():
        key = name.split("/", 1)[1]
        expected = state[key] if name in heads else trained[name]
        assert torch.equal(tensor, expected), name


@pytest.mark.parametrize("head", ["reset", "recenter"])
def test_changing_the_warmup_head_needs_a_warmup(head):
    with pytest.raises(ValueError, match="needs warmup_rounds"):
        ExperimentConfig(warmup_head=head)
    with pytest.raises(ValueError, match="warmup_head must be one of"):
        ExperimentConfig(warmup_rounds=2, warmup_head="drop")


def test_recentering_keeps_every_rank_and_moves_scores_towards_a_half():
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    images = torch.randn(64, 1, 28, 28)
    tensors = {f"{WEIGHT}{k}": v.detach().clone() for k, v in model.named_parameters()}
    tensors |= {f"{BUFFER}{k}": v.clone() for k, v in model.named_buffers()}
    bias = next(n for n in tensors if n.endswith("out.bias"))
    with torch.no_grad():  # a head that scores every image near p = 5 %, as after CE
        before_logits = model(images).squeeze(1)
        tensors[bias] -= before_logits.mean() - math.log(0.05 / 0.95)
        model.load_state_dict({n.split("/", 1)[1]: t for n, t in tensors.items()})
        before = torch.sigmoid(model(images).squeeze(1))
        recentered = recenter_classifier(tensors, [0.05])
        model.load_state_dict({n.split("/", 1)[1]: t for n, t in recentered.items()})
        after = torch.sigmoid(model(images).squeeze(1))
    assert torch.equal(torch.argsort(before), torch.argsort(after))  # same ranking, same AUC
    assert abs(float(after.mean()) - 0.5) < abs(float(before.mean()) - 0.5) / 4
    slope = lambda h: float((h * (1 - h)).mean())  # noqa: E731
    assert slope(after) > 3 * slope(before)
    changed = [n for n in tensors if not torch.equal(tensors[n], recentered[n])]
    assert changed == [bias]


def test_image_files_default_to_the_auc_recipe_that_won_on_validation():
    files = "medmnist:x.npz"
    warm = ExperimentConfig(data=files, warmup_rounds=2)
    assert warm.warmup_head == "recenter" and warm.backend_options == {"dual_lr": "prevalence"}
    assert ExperimentConfig(data=files, warmup_rounds=0).warmup_head == "keep"  # no warm-up
    chosen = ExperimentConfig(data=files, warmup_rounds=2, warmup_head="keep",
                              backend_options={"dual_lr": 0.3})  # fmt: skip
    assert chosen.warmup_head == "keep" and chosen.backend_options == {"dual_lr": 0.3}
    # cross-entropy, backends with their own α steps and the synthetic demo keep theirs
    assert ExperimentConfig(data=files, algorithm="fedavg", warmup_rounds=2).backend_options == {}
    assert ExperimentConfig(data=files, algorithm="fed_norm_sgda").backend_options == {}
    demo = ExperimentConfig(warmup_rounds=2)
    assert demo.warmup_head == "keep" and demo.backend_options == {}

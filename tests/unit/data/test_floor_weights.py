"""A positive floor changes which rows a batch holds, not the AUC objective.

The AUC losses weight rows by the data's prevalence p, so a batch that over-samples
positives would move α's maximizer away from m + mean(h | y=0) − mean(h | y=1), the value
the min-max problem is built around (with p = 2 % and 1, 2, 3, 7 positives of 32 it landed
at 1.15, 0.83, 0.51 and −0.77 instead of 0.99). The samplers hand out row weights that
undo the over-sampling; these tests check that property, not the weights' formula.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fed_auc.data.base import Split
from fed_auc.data.poisson import PoissonBatches
from fed_auc.data.sampling import BatchStream
from fed_auc.losses import AUCMarginLoss, AUCSquareLoss, CrossEntropyLoss
from fed_auc.privacy.dp_sgd import per_example_gradients
from fed_auc.trainable import Trainable

MARGIN = 1.0


class StoredLogits(nn.Module):
    """A 'network' whose logit for a row is the row's one-pixel image: fixed scores."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), 1)


def scored_split(n: int = 400, positives: int = 8, seed: int = 0) -> Split:
    """n rows, ``positives`` of them positive, each with a fixed logit (positives higher)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.zeros(n, 1, dtype=torch.float64)
    labels[torch.randperm(n, generator=generator)[:positives]] = 1.0
    logits = torch.randn(n, 1, generator=generator, dtype=torch.float64) + labels
    return Split(logits.view(n, 1, 1, 1), labels)


def alpha_maximizer(trainable: Trainable, batch) -> float:
    """The α at which the batch loss's autograd ∂/∂α is zero, by bisection (it is concave)."""
    low, high = -20.0, 20.0
    for _ in range(80):
        middle = (low + high) / 2
        with torch.no_grad():
            trainable.loss.alpha.fill_(middle)
        _, _, (dual,) = trainable.gradients(*batch)
        low, high = (middle, high) if float(dual) > 0 else (low, middle)
    return (low + high) / 2


@pytest.mark.parametrize("floor_positives", [1, 2, 3, 7])
def test_alpha_maximizer_of_a_floored_batch_is_its_class_mean_gap(floor_positives: int) -> None:
    split = scored_split()
    p = float(split.labels.mean())  # one site: the federation's p is the site's
    stream = BatchStream(split, 32, seed=floor_positives, min_pos_fraction=floor_positives / 32)
    trainable = Trainable(StoredLogits(), AUCMarginLoss(pos_ratio=p, margin=MARGIN).double())
    for _ in range(5):
        batch = next(stream)
        positive = batch.labels[:, 0] == 1
        assert int(positive.sum()) >= floor_positives
        h = torch.sigmoid(batch.images.flatten())
        gap = MARGIN + float(h[~positive].mean()) - float(h[positive].mean())
        assert alpha_maximizer(trainable, batch) == pytest.approx(gap, abs=1e-6)
        unweighted = alpha_maximizer(trainable, batch[:2])  # the batch without its weights
        assert abs(unweighted - gap) > 0.05  # the bias the weights remove


def weighted_means(stream, values: torch.Tensor, draws: int) -> tuple[float, float]:
    """Over ``draws`` batches: mean of Σ_i w_i·v_i / batch_size and of the unweighted Σ_i v_i
    / batch_size, with v read off each row's stored index."""
    weighted, plain = 0.0, 0.0
    for _ in range(draws):
        batch = next(stream)
        v = values[batch.images.flatten().long()]
        weighted += float((batch.weights.double() * v).sum()) / stream.batch_size
        plain += float(v.sum()) / stream.batch_size
    return weighted / draws, plain / draws


def indexed_split(n: int, positives: int) -> Split:
    """Images carry their row index, so a batch's rows can be read back."""
    labels = torch.zeros(n, 1)
    labels[:positives] = 1.0
    return Split(torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), labels)


@pytest.mark.parametrize(
    ("stream_class", "floors"),
    [
        (BatchStream, {"min_pos_fraction": 0.2}),
        (BatchStream, {"min_pos_fraction": 0.1, "min_neg_fraction": 0.3}),
        (PoissonBatches, {"min_pos_fraction": 0.2}),
    ],
)
def test_weighted_batches_are_unbiased_for_the_split_mean(stream_class, floors) -> None:
    split = indexed_split(300, 9)  # 3 % positive
    values = torch.linspace(0.0, 1.0, 300, dtype=torch.float64) ** 2
    values[:9] += 5.0  # positives carry large values: over-sampling them shows
    stream = stream_class(split, 16, seed=3, **floors)
    weighted, plain = weighted_means(stream, values, 4000)
    target = float(values.mean())
    assert weighted == pytest.approx(target, rel=0.03)
    assert plain > 1.5 * target  # without weights the floor's positives weigh too much


def test_a_stream_without_floors_weights_every_row_one() -> None:
    split = indexed_split(300, 9)
    batch = next(BatchStream(split, 16, seed=0, min_pos_fraction=0.0))
    assert torch.equal(batch.weights, torch.ones(16))
    poisson = next(PoissonBatches(split, 16, seed=0, min_pos_fraction=0.0))
    assert torch.equal(poisson.weights, torch.ones(len(poisson.labels)))


def test_cross_entropy_trains_on_the_batch_as_drawn() -> None:
    """The floor is class rebalancing for the cross-entropy baseline: weights do not reach it."""
    split = scored_split()
    batch = next(BatchStream(split, 32, seed=0, min_pos_fraction=0.2))
    model = nn.Sequential(StoredLogits(), nn.Linear(1, 1)).double()
    value, _, _ = Trainable(model, CrossEntropyLoss()).gradients(*batch)
    logits = model(batch.images).detach()
    want = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    assert float(value) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("loss_class", [AUCMarginLoss, AUCSquareLoss])
def test_per_example_gradients_carry_the_row_weights(loss_class) -> None:
    """DP-SGD clips each row's own weighted gradient, and their mean is the weighted batch's."""
    split = scored_split()
    batch = next(PoissonBatches(split, 64, seed=1, min_pos_fraction=0.2))
    assert len({round(float(w), 12) for w in batch.weights}) == 2  # both classes, re-weighted
    torch.manual_seed(0)
    model = nn.Sequential(StoredLogits(), nn.Linear(1, 1)).double()
    trainable = Trainable(model, loss_class(pos_ratio=float(split.labels.mean())).double())
    with torch.no_grad():
        trainable.loss.alpha.fill_(0.4)
    names = [*trainable.primal, *trainable.dual]
    _, per_example = per_example_gradients(trainable, batch.images, batch.labels, names,
                                           row_weights=batch.weights)  # fmt: skip
    _, primal, dual = trainable.gradients(*batch)
    for got, want in zip(per_example, primal + dual, strict=True):
        torch.testing.assert_close(got.mean(dim=0), want, rtol=1e-9, atol=1e-12)
    _, plain = per_example_gradients(trainable, batch.images, batch.labels, names)
    i = int(torch.argmax(batch.weights))
    for got, unweighted in zip(per_example, plain, strict=True):
        torch.testing.assert_close(got[i], batch.weights[i] * unweighted[i], rtol=1e-9, atol=0)

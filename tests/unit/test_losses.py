"""AUC min-max losses: formula, gradients, saddle point, masking, multi-label, validation."""

from __future__ import annotations

import math

import pytest
import torch

from fed_auc.losses import (
    LOSSES,
    AUCMarginLoss,
    AUCSquareLoss,
    CrossEntropyLoss,
    auc_margin_loss,
    auc_square_loss,
    build_loss,
)

AUC_LOSSES = ("auc_margin", "auc_square")


def _batch(n: int = 12, labels: int = 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits and 0/1 targets with both classes present in every label column."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, labels, generator=gen, dtype=torch.float64)
    targets = (torch.rand(n, labels, generator=gen) < 0.4).to(torch.float64)
    targets[0], targets[1] = 1.0, 0.0
    return logits, targets


def _loss(name: str, labels: int = 1, pos_ratio=0.3, **kw) -> torch.nn.Module:
    cls = AUCMarginLoss if name == "auc_margin" else AUCSquareLoss
    loss = cls(labels, pos_ratio=pos_ratio, **kw).double()
    loss.set_pos_ratio(pos_ratio)  # full float64 precision, not float32 cast up
    return loss


def _reference(name: str, h, y, a, b, alpha, p, m=1.0) -> float:
    """The spec's per-label formula written out with Python loops (known rows only)."""
    h, y, a, b, alpha, p = (t.detach().tolist() for t in (h, y, a, b, alpha, p))
    total = 0.0
    for j in range(len(a)):
        rows = [i for i in range(len(h)) if not math.isnan(y[i][j])]
        if not rows:
            continue
        aj, bj, al, pj = a[j], b[j], alpha[j], p[j]
        s = 0.0
        for i in rows:
            hi, pos = h[i][j], y[i][j] == 1.0
            if name == "auc_square":
                s += (1 - pj) * (hi - aj) ** 2 * pos + pj * (hi - bj) ** 2 * (not pos)
                s += 2 * (1 + al) * (pj * hi * (not pos) - (1 - pj) * hi * pos)
                s -= pj * (1 - pj) * al**2
            else:
                s += (1 - pj) * (hi - aj) ** 2 * pos + pj * (hi - bj) ** 2 * (not pos)
                s += 2 * al * (pj * hi * (not pos) - (1 - pj) * hi * pos)
        s /= len(rows)
        if name == "auc_margin":
            s += 2 * al * pj * (1 - pj) * m - pj * (1 - pj) * al**2
        total += s
    return total


def _set(loss: torch.nn.Module, a, b, alpha) -> None:
    with torch.no_grad():
        for prm, value in zip((loss.a, loss.b, loss.alpha), (a, b, alpha), strict=True):
            prm.copy_(torch.as_tensor(value, dtype=prm.dtype))


@pytest.mark.parametrize("name", AUC_LOSSES)
@pytest.mark.parametrize("labels", [1, 3])
def test_matches_written_out_formula(name: str, labels: int) -> None:
    logits, targets = _batch(10, labels, seed=1)
    targets[3, 0] = float("nan")
    p = [0.2, 0.5, 0.7][:labels]
    loss = _loss(name, labels, pos_ratio=p, **({"margin": 0.6} if name == "auc_margin" else {}))
    _set(loss, torch.rand(labels), torch.rand(labels), torch.rand(labels) + 0.1)
    expected = _reference(
        name, torch.sigmoid(logits), targets, loss.a, loss.b, loss.alpha, loss.pos_ratio, m=0.6
    )
    assert loss(logits, targets).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", AUC_LOSSES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_saddle_in_a_b_alpha_has_the_pairwise_surrogate_as_its_value(name: str, seed: int) -> None:
    """With p the batch's positive fraction, the min over (a, b) and max over α of the
    min-max loss is at a = μ⁺, b = μ⁻, α = m + μ⁻ − μ⁺ (Ying et al., 2016; m = 1 inside
    CODASCA's (1 + α)), and its value is p(1−p) times the pairwise square surrogate over
    every (positive, negative) pair, E[(m − h⁺ + h⁻)²] (minus 1 for the square loss): a
    reference computed from the pairs, not from the loss's formula."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(20, 1, generator=gen, dtype=torch.float64)
    targets = (torch.rand(20, 1, generator=gen) < 0.3).to(torch.float64)
    targets[0], targets[1] = 1.0, 0.0
    pos, neg = scores[targets == 1], scores[targets == 0]
    p = torch.tensor([len(pos) / 20], dtype=torch.float64)
    m = 0.7
    a, b = pos.mean().reshape(1), neg.mean().reshape(1)
    alpha = (m if name == "auc_margin" else 0.0) + b - a
    variables = [t.clone().requires_grad_() for t in (a, b, alpha)]
    if name == "auc_margin":
        value = auc_margin_loss(scores, targets, *variables, p, m)
        pairwise = ((m - pos[:, None] + neg[None, :]) ** 2).mean()
    else:
        value = auc_square_loss(scores, targets, *variables, p)
        pairwise = ((1 - pos[:, None] + neg[None, :]) ** 2).mean() - 1
    assert float(value) == pytest.approx(float(p * (1 - p) * pairwise), rel=1e-12)
    grads = torch.autograd.grad(value, variables)
    assert all(abs(float(g)) < 1e-12 for g in grads)  # stationary
    hessian_alpha = torch.autograd.functional.hessian(
        lambda al: (
            auc_square_loss(scores, targets, a, b, al, p)
            if name == "auc_square"
            else auc_margin_loss(scores, targets, a, b, al, p, m)
        ),
        alpha,
    )
    assert float(hessian_alpha) < 0  # a maximum in α (strongly concave: −2p(1−p))


@pytest.mark.parametrize("name", AUC_LOSSES)
def test_closed_form_per_sample_gradients(name: str) -> None:
    """Notes §1.3 (square) and its AUC-M analogue, averaged over the batch, equal autograd."""
    _, targets = _batch(16, 1, seed=5)
    p, m, n = 0.35, 1.0, 16
    core = auc_square_loss if name == "auc_square" else auc_margin_loss
    extra = () if name == "auc_square" else (m,)
    h = torch.rand(16, 1, dtype=torch.float64, requires_grad=True)
    a, b, alpha = (
        torch.tensor([v], dtype=torch.float64, requires_grad=True) for v in (0.6, 0.3, 0.4)
    )
    core(h, targets, a, b, alpha, torch.tensor([p], dtype=torch.float64), *extra).backward()

    hd, y1 = h.detach(), (targets == 1).double()
    y0, ad, bd, al = 1 - y1, a.detach(), b.detach(), alpha.detach()
    coupling = (1 + al) if name == "auc_square" else al
    grad_h = 2 * (1 - p) * (hd - ad) * y1 + 2 * p * (hd - bd) * y0
    grad_h = grad_h + 2 * coupling * (p * y0 - (1 - p) * y1)
    grad_a = -2 * (1 - p) * (hd - ad) * y1
    grad_b = -2 * p * (hd - bd) * y0
    grad_alpha = 2 * (p * hd * y0 - (1 - p) * hd * y1) - 2 * p * (1 - p) * al
    if name == "auc_margin":
        grad_alpha = grad_alpha + 2 * p * (1 - p) * m

    torch.testing.assert_close(h.grad, grad_h / n)
    torch.testing.assert_close(a.grad, grad_a.mean(0))
    torch.testing.assert_close(b.grad, grad_b.mean(0))
    torch.testing.assert_close(alpha.grad, grad_alpha.mean(0))


def _solve_saddle(loss: torch.nn.Module, logits, targets, steps: int = 400, lr: float = 1.0):
    """Gradient descent on (a, b), projected ascent on alpha, scores held fixed."""
    for _ in range(steps):
        loss.zero_grad()
        loss(logits, targets).backward()
        with torch.no_grad():
            for prm in loss.primal_params:
                prm -= lr * prm.grad
            for prm in loss.dual_params:
                prm += lr * prm.grad
        loss.project_()
    return loss.a.item(), loss.b.item(), loss.alpha.item()


@pytest.mark.parametrize(
    ("name", "margin", "separated"),
    [("auc_square", None, False), ("auc_margin", 1.0, False), ("auc_margin", 0.1, True)],
)
def test_saddle_point_is_class_means(name: str, margin: float | None, separated: bool) -> None:
    logits, targets = _batch(20, 1, seed=6)
    if separated:  # positives near 0.9, negatives near 0.1: m + b - a < 0, so alpha* = 0
        logits = torch.where(targets == 1, 2.2, -2.2) + 0.05 * logits
    p = targets.mean().item()
    kw = {} if margin is None else {"margin": margin}
    loss = _loss(name, 1, pos_ratio=p, **kw)
    h = torch.sigmoid(logits)
    mean_pos, mean_neg = h[targets == 1].mean().item(), h[targets == 0].mean().item()
    if name == "auc_square":
        expected_alpha = mean_neg - mean_pos
    else:
        expected_alpha = max(0.0, margin + mean_neg - mean_pos)
    if separated:
        assert expected_alpha == 0.0

    a, b, alpha = _solve_saddle(loss, logits, targets)
    assert a == pytest.approx(mean_pos, abs=1e-8)
    assert b == pytest.approx(mean_neg, abs=1e-8)
    assert alpha == pytest.approx(expected_alpha, abs=1e-8)

    # At the closed-form point, the gradient in (a, b) vanishes; in alpha it vanishes or,
    # when the constraint alpha >= 0 is active, points out of the feasible set.
    _set(loss, [mean_pos], [mean_neg], [expected_alpha])
    loss.zero_grad()
    loss(logits, targets).backward()
    assert abs(loss.a.grad.item()) < 1e-12 and abs(loss.b.grad.item()) < 1e-12
    if separated:
        assert loss.alpha.grad.item() < 0
    else:
        assert abs(loss.alpha.grad.item()) < 1e-12


@pytest.mark.parametrize("name", AUC_LOSSES)
def test_batch_without_positives(name: str) -> None:
    logits, _ = _batch(8, 1, seed=7)
    targets = torch.zeros(8, 1, dtype=torch.float64)
    loss = _loss(name, 1)
    _set(loss, [0.5], [0.2], [0.3])
    logits.requires_grad_()
    value = loss(logits, targets)
    value.backward()
    assert torch.isfinite(value)
    assert loss.a.grad.item() == 0.0
    for grad in (loss.b.grad, loss.alpha.grad, logits.grad):
        assert torch.isfinite(grad).all()
    assert loss.b.grad.abs().item() > 0


@pytest.mark.parametrize("name", AUC_LOSSES)
def test_nan_rows_equal_dropping_them(name: str) -> None:
    logits, targets = _batch(12, 1, seed=8)
    masked = targets.clone()
    masked[[2, 5, 9]] = float("nan")
    keep = ~torch.isnan(masked[:, 0])
    loss = _loss(name, 1)
    _set(loss, [0.6], [0.4], [0.2])
    full = loss(logits, masked)
    full.backward()
    grads = [p.grad.clone() for p in loss.parameters()]
    loss.zero_grad()
    dropped = loss(logits[keep], targets[keep])
    dropped.backward()
    torch.testing.assert_close(full, dropped)
    for g_full, prm in zip(grads, loss.parameters(), strict=True):
        torch.testing.assert_close(g_full, prm.grad)


@pytest.mark.parametrize("name", AUC_LOSSES)
def test_all_unknown_label_column_contributes_nothing(name: str) -> None:
    logits, targets = _batch(6, 2, seed=9)
    targets[:, 1] = float("nan")
    loss = _loss(name, 2, pos_ratio=[0.3, 0.3])
    _set(loss, [0.5, 0.5], [0.1, 0.1], [0.7, 0.7])
    logits.requires_grad_()
    value = loss(logits, targets)
    value.backward()
    single = _loss(name, 1)
    _set(single, [0.5], [0.1], [0.7])
    torch.testing.assert_close(value, single(logits[:, :1].detach(), targets[:, :1]))
    for prm in loss.parameters():
        assert prm.grad[1].item() == 0.0
    assert (logits.grad[:, 1] == 0).all()


@pytest.mark.parametrize("name", AUC_LOSSES)
def test_multilabel_is_sum_of_single_label_losses(name: str) -> None:
    labels = 3
    logits, targets = _batch(14, labels, seed=10)
    targets[4, 1] = targets[7, 2] = float("nan")
    p = [0.2, 0.45, 0.6]
    a, b, alpha = torch.rand(labels), torch.rand(labels), torch.rand(labels)
    multi = _loss(name, labels, pos_ratio=p)
    _set(multi, a, b, alpha)
    total = multi(logits, targets)
    total.backward()
    singles = 0.0
    for j in range(labels):
        single = _loss(name, 1, pos_ratio=p[j])
        _set(single, a[j : j + 1], b[j : j + 1], alpha[j : j + 1])
        value = single(logits[:, j : j + 1], targets[:, j : j + 1])
        value.backward()
        singles = singles + value.detach()
        for name_, prm in single.named_parameters():
            torch.testing.assert_close(prm.grad[0], getattr(multi, name_).grad[j])
    torch.testing.assert_close(total.detach(), singles)


@pytest.mark.parametrize("name", AUC_LOSSES)
@pytest.mark.parametrize(
    ("labels", "bad"),
    [
        (1, 0.0),
        (1, 1.0),
        (1, -0.1),
        (1, 1.5),
        (1, float("nan")),
        (1, None),
        (3, [0.2, 0.3]),
        (2, [0.2, 1.2]),
    ],
)
def test_bad_pos_ratio_raises(name: str, labels: int, bad) -> None:
    with pytest.raises(ValueError, match="pos_ratio"):
        build_loss(name, labels, bad)
    loss = build_loss(name, labels, 0.3)
    with pytest.raises(ValueError, match="pos_ratio"):
        loss.set_pos_ratio(bad)
    assert loss.pos_ratio.tolist() == pytest.approx([0.3] * labels)


def test_set_pos_ratio_updates_buffer_and_broadcasts() -> None:
    loss = build_loss("auc_margin", 3, 0.1)
    assert loss.pos_ratio.tolist() == pytest.approx([0.1] * 3)
    loss.set_pos_ratio([0.2, 0.3, 0.4])
    assert loss.pos_ratio.tolist() == pytest.approx([0.2, 0.3, 0.4])
    assert loss.pos_ratio.dtype == torch.float32
    assert set(loss.state_dict()) == {"a", "b", "alpha"}


def test_projection() -> None:
    margin, square = build_loss("auc_margin", 2, 0.3), build_loss("auc_square", 2, 0.3)
    for loss in (margin, square):
        _set(loss, [0.0, 0.0], [0.0, 0.0], [-0.5, 0.25])
        loss.project_()
    assert margin.alpha.tolist() == [0.0, 0.25]
    assert square.alpha.tolist() == [-0.5, 0.25]


def test_interface_and_registry() -> None:
    assert LOSSES == ("auc_margin", "auc_square", "ce")
    for name in AUC_LOSSES:
        loss = build_loss(name, 2, [0.3, 0.4])
        assert loss.is_minimax
        assert loss.primal_params == [loss.a, loss.b]
        assert loss.dual_params == [loss.alpha]
        assert all(p.shape == (2,) and (p == 0).all() for p in loss.parameters())
    ce = build_loss("ce", 2, None)
    assert isinstance(ce, CrossEntropyLoss) and not ce.is_minimax
    assert list(ce.parameters()) == []
    with pytest.raises(ValueError, match="auc_margin, auc_square, ce"):
        build_loss("hinge", 1, 0.3)


@pytest.mark.parametrize("name", [*AUC_LOSSES, "ce"])
def test_bad_targets_and_shapes_raise(name: str) -> None:
    loss = build_loss(name, 2, 0.3)
    logits = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="targets"):
        loss(logits, torch.full((4, 2), 2.0))
    with pytest.raises(ValueError, match=r"\(B, 2\)"):
        loss(logits, torch.zeros(4, 3))


def test_one_dimensional_inputs_for_a_single_label() -> None:
    logits, targets = _batch(6, 1, seed=11)
    loss = _loss("auc_margin", 1)
    torch.testing.assert_close(loss(logits[:, 0], targets[:, 0]), loss(logits, targets))


def test_cross_entropy_masks_nan() -> None:
    logits, targets = _batch(10, 2, seed=12)
    masked = targets.clone()
    masked[[1, 4], 0] = float("nan")
    masked[7, 1] = float("nan")
    keep = ~torch.isnan(masked)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[keep], targets[keep])
    ce = CrossEntropyLoss(2)
    torch.testing.assert_close(ce(logits, masked), expected)
    all_nan = ce(logits.requires_grad_(), torch.full_like(targets, float("nan")))
    all_nan.backward()
    assert all_nan.item() == 0.0 and (logits.grad == 0).all()

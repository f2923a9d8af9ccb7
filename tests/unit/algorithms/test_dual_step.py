"""α's own step size ``dual_lr`` (issue 18 item 9) on the SGDA-family backends."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.common.toy import saddle_point, toy_sites, zero_noise
from fed_auc.algorithms import ALGORITHMS, build_backend
from tests.support.backends import NO_EXTRAS, _run

FAMILY = ["local_sgda", "coda_plus", "codasca"]


def _backend(name: str, **hp):
    extra = {} if name == "local_sgda" else {"gamma": 0.0}
    return build_backend(name, **NO_EXTRAS, **extra, **hp)


def _noise(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (
        (
            torch.randn(2, generator=gen, dtype=torch.float64),
            torch.randn(1, generator=gen, dtype=torch.float64),
        )
        for _ in itertools.count()
    )


@pytest.mark.parametrize("name", FAMILY)
def test_dual_lr_equal_to_lr_is_the_papers_run_bit_for_bit(name):
    runs = []
    for dual_lr in (None, 0.05):
        sites = toy_sites(3)
        backend = _backend(name, lr=0.05, dual_lr=dual_lr, local_steps=3, decay_every=6)
        state, _ = _run(backend, sites, [_noise(k) for k in range(3)], rounds=5)
        runs.append(backend.global_tensors(state))
    for tensor_name in runs[0]:
        assert torch.equal(runs[0][tensor_name], runs[1][tensor_name]), tensor_name


@pytest.mark.parametrize("name", FAMILY)
def test_alpha_moves_dual_lr_times_its_gradient_and_the_primal_does_not_notice(name):
    """From (x, y) = 0 the toy's gradients are known: ∇_y f = −d, ∇_x f = e."""
    steps = {}
    for dual_lr in (None, 0.3):
        site = toy_sites(1)[0]
        backend = _backend(name, lr=0.05, dual_lr=dual_lr, local_steps=1)
        state, _ = _run(backend, [site], [zero_noise()], rounds=1)
        steps[dual_lr] = backend.global_tensors(state)
    site = toy_sites(1)[0]
    torch.testing.assert_close(steps[0.3]["auc/alpha"], 0.3 * -site.d, rtol=1e-12, atol=0)
    torch.testing.assert_close(steps[None]["auc/alpha"], 0.05 * -site.d, rtol=1e-12, atol=0)
    assert torch.equal(steps[0.3]["w/x"], steps[None]["w/x"])


def test_codasca_control_variate_of_alpha_estimates_its_gradient_whatever_its_step():
    """c_α^k after one round is the mean α gradient (here the exact one, −d), not
    dual_lr/lr times it: each variable's Δc divides by its own step size."""
    for dual_lr in (None, 0.2, 0.9):
        site = toy_sites(1)[0]
        backend = _backend("codasca", lr=0.05, dual_lr=dual_lr, local_steps=1)
        _, local = _run(backend, [site], [zero_noise()], rounds=1)
        torch.testing.assert_close(local[0]["control"]["auc/alpha"], -site.d, rtol=1e-12, atol=0)
        torch.testing.assert_close(local[0]["control"]["w/x"], site.e, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("name", "local_steps", "rounds"),
    [("codasca", 20, 300), ("local_sgda", 1, 3000), ("coda_plus", 1, 3000)],
)
def test_the_saddle_point_does_not_move_with_dual_lr(name, local_steps, rounds):
    sites = toy_sites(4)
    backend = _backend(name, lr=0.05, dual_lr=0.2, local_steps=local_steps)
    state, _ = _run(backend, sites, [zero_noise() for _ in sites], rounds)
    x_star, y_star = saddle_point(sites)
    model = backend.global_tensors(state)
    assert float(torch.cat([model["w/x"] - x_star, model["auc/alpha"] - y_star]).norm()) < 1e-6


@pytest.mark.parametrize("name", FAMILY)
def test_dual_lr_must_be_positive(name):
    with pytest.raises(ValueError, match="dual_lr"):
        build_backend(name, dual_lr=0.0)


@pytest.mark.parametrize("p", [0.015, 0.05, 0.3])
def test_prevalence_dual_step_contracts_alpha_by_two_eta_at_any_prevalence(p):
    """The AUC-margin loss's own ∂F/∂α (autograd, a batch at prevalence p): one step of
    ``dual_lr = "prevalence"`` takes α from 0 to 2η·α* with α* its maximizer, whatever p;
    the paper's single η moves it 1/(p(1−p)) times less."""
    from fed_auc.losses import auc_margin_loss

    gen = torch.Generator().manual_seed(0)
    n, n_pos = 2000, round(2000 * p)
    targets = torch.zeros(n, 1, dtype=torch.float64)
    targets[:n_pos] = 1.0
    scores = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 0.5 + 0.3 * targets
    p_batch = torch.tensor([n_pos / n], dtype=torch.float64)
    a, b = scores[:n_pos].mean().reshape(1), scores[n_pos:].mean().reshape(1)

    def dual_gradient(alpha: float) -> float:
        alpha_t = torch.tensor([alpha], dtype=torch.float64, requires_grad=True)
        auc_margin_loss(scores, targets, a, b, alpha_t, p_batch, 1.0).backward()
        return float(alpha_t.grad)

    # α* where the concave objective's derivative vanishes, found by bisection
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dual_gradient(mid) > 0 else (lo, mid)
    alpha_star = lo
    eta = 0.2
    backend = _backend("codasca", lr=eta, dual_lr="prevalence")
    backend.set_prevalence([n_pos / n])
    after = backend.dual_lr_of(0) * dual_gradient(0.0)
    assert after == pytest.approx(2 * eta * alpha_star, rel=1e-9)
    single = _backend("codasca", lr=eta)
    assert single.dual_lr_of(0) * dual_gradient(0.0) == pytest.approx(
        2 * eta * alpha_star * p_batch.item() * (1 - p_batch.item()), rel=1e-9
    )


def test_prevalence_dual_step_is_refused_where_it_would_diverge_or_is_not_set():
    with pytest.raises(ValueError, match="needs lr < 1"):
        _backend("codasca", lr=1.0, dual_lr="prevalence")
    with pytest.raises(RuntimeError, match="set_prevalence"):
        _backend("codasca", lr=0.2, dual_lr="prevalence").dual_lr_of(0)
    with pytest.raises(ValueError, match="dual_lr must be a finite number"):
        _backend("codasca", lr=0.2, dual_lr="often")


@pytest.mark.parametrize("name", ["fedsgda_mb", "fedsgda_storm", "fed_norm_sgda"])
def test_backends_with_their_own_alpha_rule_name_the_ones_that_take_prevalence(name):
    with pytest.raises(ValueError, match=f"not available for {name}.*codasca, coda_plus"):
        build_backend(name, dual_lr="prevalence")
    with pytest.raises(ValueError, match="dual_lr must be a finite number"):
        build_backend(name, dual_lr=-1.0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_backend_says_whether_its_dual_step_takes_the_prevalence_and_keeps_its_word(name):
    """``prevalence_dual_step`` is what the image-file recipe reads: a backend that claims it
    builds with ``dual_lr = "prevalence"``, one that does not refuses it by name."""
    if ALGORITHMS[name].prevalence_dual_step:
        assert build_backend(name, dual_lr="prevalence").dual_lr == "prevalence"
    else:
        with pytest.raises(ValueError, match="'prevalence' is not available for"):
            build_backend(name, dual_lr="prevalence")

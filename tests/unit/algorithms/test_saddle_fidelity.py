"""A representative subset of the saddle-fidelity table (``benchmarks/claims/saddle_fidelity.py``):
each cell within its backend's tolerance of the right saddle point, or refused by name.

Among them the cells that failed before issue 18's decisions: DP clipping of gradient replies
(now clipped as the move they make), FedSGDA under sampling (now the decaying schedule), and
the median (now refused for every backend, centered clipping instead).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.claims.saddle_fidelity import SETTINGS, WEAK, cell, run_toy, within

CELLS = [  # (backend, participation, transform, weak, rounds: fewer where that is enough)
    ("codasca", "half", "plain", WEAK, 300),
    ("codasca", "half", "dp_clip", WEAK, 300),
    ("codasca", "full", "centered_clip", (), 1),  # refused
    ("coda_plus", "full", "dp_clip", WEAK, None),
    ("coda_plus", "half", "centered_clip", WEAK, None),
    ("local_sgda", "full", "median", (), 1),  # refused
    ("local_sgda", "full", "centered_clip", WEAK, 600),
    ("fedavg", "half", "centered_clip", (), None),
    ("fedsgda_mb", "full", "plain", WEAK, 40),
    ("fedsgda_mb", "full", "dp_clip", (), 1),  # refused
    ("fedsgda_storm", "full", "plain", (), 40),
    ("fedsgda_storm", "half", "centered_clip", WEAK, 1),  # refused
    ("fed_norm_sgda", "full", "plain", WEAK, None),
    ("fed_norm_sgda", "full", "dp_clip", (), 600),
    ("fed_norm_sgda_plus", "half", "dp_clip", WEAK, None),
]


@pytest.mark.parametrize(("algorithm", "participation", "transform", "weak", "rounds"), CELLS)
def test_cell_is_within_tolerance_or_refused(algorithm, participation, transform, weak, rounds):
    text = cell(algorithm, participation, transform, weak, rounds)
    assert within(text, SETTINGS[algorithm]["tolerance"]), text


@pytest.mark.slow
def test_fedsgda_storm_with_its_decaying_schedule_converges_under_sampling():
    """3 of 6 heterogeneous sites per round: ρ = 0.5 reaches the saddle point (a constant
    step stays 0.65 away: the paper's neighbourhood of size ∝ σ²/S)."""
    text = cell("fedsgda_storm", "half", "plain", ())
    assert within(text, SETTINGS["fedsgda_storm"]["tolerance"]), text


def test_refusals_name_alternatives_that_are_accepted():
    """CODASCA's refusal of robust aggregation points to backends that accept it."""
    from fed_auc.algorithms import build_backend
    from fed_auc.coordinator.robust import Aggregation

    clip = Aggregation.parse("centered_clip:1")
    with pytest.raises(ValueError, match="or use coda_plus or local_sgda with centered_clip"):
        clip.check_backend(build_backend("codasca"))
    for accepted in ("coda_plus", "local_sgda"):
        clip.check_backend(build_backend(accepted))


@pytest.mark.slow
@settings(max_examples=4, derandomize=True, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=6),
    seed=st.integers(min_value=0, max_value=2**20),
    transform=st.sampled_from(["plain", "dp_clip"]),
)
def test_codasca_is_exact_under_drawn_participation_patterns(count, seed, transform):
    """Any number of the 6 sites per round, any seeded draw: CODASCA's control variates
    (SAGA-style under sampling, c^k from the sent iterate under DP) keep it exact."""
    hyper = SETTINGS["codasca"]["hyper"]
    distance = run_toy("codasca", transform, WEAK, 300, count / 6, seed=seed, **hyper)
    assert distance < SETTINGS["codasca"]["tolerance"]


@pytest.mark.parametrize("eta_g", [0.5, 1.5])
def test_codasca_server_step_other_than_one_keeps_the_saddle_point(eta_g):
    """η_g scales the server's extrapolation x ← x + η_g (mean x_k − x): it changes the
    speed, not the fixed point (half participation, one weak site, DP clipping)."""
    hyper = {**SETTINGS["codasca"]["hyper"], "eta_g": eta_g}
    distance = run_toy("codasca", "dp_clip", WEAK, 300, 0.5, **hyper)
    assert distance < SETTINGS["codasca"]["tolerance"]

"""The options that protect a run: robust aggregation, differential privacy (update-level or
DP-SGD, with an accountant per site) and secure aggregation. What each protects and against whom:
docs/privacy.md and hospitals/README.md."""

from __future__ import annotations

from dataclasses import dataclass

from fed_auc.coordinator.robust import Aggregation
from fed_auc.experiment.kinds import Interval, OneOf, Parsed
from fed_auc.experiment.option import option
from fed_auc.models import NORMS
from fed_auc.privacy.dp_sgd import DP_MODES

_PRIVACY = "[hospitals/README.md](../hospitals/README.md#differential-privacy-what-each-option-protects-and-what-it-does-not)"  # noqa: E501


@dataclass
class ProtectionOptions:
    """Robust aggregation, DP and secure aggregation. The DP settings are checked together by
    ``fed_auc.privacy`` (``ExampleDP``, ``UpdateDP``) and the secure ones by
    ``SecureAggregation``, in ``ExperimentChecks``."""

    max_update_norm: float | None = option(
        None,
        help="reject a reply whose update (‖v_k − v‖, or the step a gradient reply makes the "
        "server take) exceeds this bound",
        group="protection",
        check=Interval(0, closed="(]"),
        doc="reject a reply whose update exceeds this bound, measured as the move it makes the "
        "model take: ‖v_k − v‖ for iterates, ‖rate · g‖ for gradient replies (the steps that "
        "apply them)",
        default_doc="off",
    )
    aggregation: str = option(
        "mean",
        help="mean (the backend's weighted mean) or centered_clip:τ (each reply's move clipped "
        "to within τ of the replies' median, then the backend's mean)",
        group="protection",
        check=Parsed(Aggregation.parse, "mean or centered_clip:τ"),
        doc="`mean` (the backend's) or `centered_clip:τ`: each reply's move clipped to within τ "
        "of the replies' coordinate-wise median, then the backend's mean, so replies within τ "
        "of each other are averaged exactly and any one reply's pull is bounded. Refused with "
        "`codasca` (a Δc^k derived from a clipped reply is not the c^k its node keeps) and the "
        "FedSGDA backends (their gradient replies do not vanish at the saddle point). `median` "
        "and `trimmed_mean` are refused for every backend: under heterogeneous sites they "
        "converge elsewhere (0.19–0.99 from the saddle point on the toy, BENCHMARKS.md)",
    )
    dp: str | None = option(
        None,
        help="client-side DP: 'update' clips and noises each site's whole update (site-level "
        "ε); 'example' is DP-SGD, each example's gradient clipped in every local step "
        "(example-level ε); each with an accountant per site and GroupNorm in the model",
        group="protection",
        check=OneOf(DP_MODES),
        doc="`update`: update-level DP (below, `--dp-clip`). `example`: DP-SGD on every node: "
        "each example's gradient (network, a, b and α jointly) clipped to `--dp-clip` in every "
        "local step, Gaussian noise σ·C, Poisson batches; each site's (ε, δ) for one training "
        "example, from its own accountant (Google's `dp-accounting`, RDP), in the store "
        "(`site_rounds.dp_epsilon`), on the dashboard's Sites page and in the model card; "
        "GroupNorm in the model. It does not cover counts, data summaries, metadata or "
        "evaluation results, nor a coordinator that changes the DP settings it sends: "
        f"{_PRIVACY}. Needs `pip install 'fed-auc[privacy]'`",
        default_doc="`update` when `--dp-clip` is given, else off",
    )
    dp_clip: float | None = option(
        None,
        help="DP clip norm C: of the move each reply block makes the model take (--dp update) "
        "or of each example's gradient (--dp example)",
        group="protection",
        doc="client-side DP's clip norm C. Under `--dp update` the move each reply block makes "
        "the model take is clipped to C and N(0, (σC)²) noise added on the node. With noise, "
        "each site's own accountant (Google's `dp-accounting`, RDP) counts every update it "
        "sends as one Gaussian mechanism (q = 1: the coordinator's seeded sample of sites is "
        "no secret, so no amplification) and records a **site-level** (ε, δ) — for replacing "
        "the whole hospital's dataset (sensitivity 2C, so σ/2 per block), not one patient — "
        "in the store, on the Sites page and in the model card; with few sites the σ a small "
        "ε needs is large. GroupNorm in the model (BatchNorm's statistics would leave "
        "un-noised), no warm-up. σ = 0 is clipping only: no ε. Refused with the FedSGDA "
        "backends (a clip of full local gradients moves the fixed point)",
        default_doc="off",
    )
    dp_noise: float = option(
        0.0, help="DP's Gaussian noise multiplier σ (noise std σ·C)", group="protection"
    )
    dp_delta: float = option(
        1e-5, help="DP's δ", group="protection", flag="--delta", default_doc="1e-5"
    )
    target_epsilon: float | None = option(
        None,
        help="derive σ so each site spends this ε over the run as its backend plans it; with "
        "--dp-noise, σ is kept and a run that would need more ε is refused before round 1",
        group="protection",
        doc="σ derived through `dp-accounting` so the run's plan spends ε at δ: every release "
        "the backend really makes (phases, full passes, gradients evaluated twice, a personal "
        "model's steps, a site's own local steps), per site from its sampling rate (`--dp "
        "example`) or per update block (`--dp update`); with `--dp-noise` too, σ is kept and a "
        "run whose plan needs more ε is refused before round 1; a site whose next update "
        "would pass ε does not send it and stops (`budget_spent`). Each node draws its noise "
        f"from a secret of its own that the coordinator cannot regenerate ({_PRIVACY})",
        default_doc="off",
    )
    norm: str | None = option(
        None,
        help="the network's normalization layers",
        group="protection",
        check=OneOf(NORMS),
        doc="the network's normalization layers (GroupNorm through MONAI's norm option); "
        "`group` without DP measures what GroupNorm alone costs",
        default_doc="`group` with `--dp example` or a noised `--dp update`, else `batch`",
    )
    secure_aggregation: bool = option(
        False,
        help="secure aggregation: the coordinator learns only the sum of the sampled sites' "
        "masked replies (refuses --aggregation centered_clip and --max-update-norm)",
        group="protection",
        doc="secure aggregation with SecAgg+'s structure (Bell et al. 2020, on Bonawitz et "
        "al.'s SecAgg 2017: each sampled site masks pairwise (X25519) and shares its secrets "
        "only with its K neighbours on a k-regular ring graph from a seed drawn each session; "
        "self masks, Shamir T-of-neighbourhood shares of the mask secrets, dropout recovery "
        "through the neighbours): an honest-but-curious coordinator learns only the sum of "
        "the sampled sites' masked replies, for every backend (CODASCA's Δc^k is computed and "
        "masked on the node; per-tensor trainer weights for partial training). It hides no "
        "site from the model the sum makes. A sum needs T surviving sites; fewer fails the "
        "round with the store intact, or ends training where sites have spent their DP "
        "budget. Combines with `--dp example` and `--dp update` (the same ε as without it). "
        "Refuses `--aggregation centered_clip:τ` and `--max-update-norm` (both need single "
        "replies); per-site drift and cosine are not recorded. What it does and does not "
        "protect: [hospitals/README.md](../hospitals/README.md#secure-aggregation---secure-"
        "aggregation); cost: BENCHMARKS.md",
    )
    secure_aggregation_threshold: int | None = option(
        None,
        help="shares that rebuild a site's secrets, from the site and its neighbours",
        group="protection",
        metavar="T",
        default_doc="a majority of the neighbourhood, ≥ 2",
    )
    secure_aggregation_neighbours: int | None = option(
        None,
        help="SecAgg+: each site masks and shares with K neighbours on a ring graph (even K, or "
        "n − 1 for the full graph)",
        group="protection",
        metavar="K",
        default_doc="2⌈log₂ n⌉ of n sampled sites, the full graph up to 7",
    )

"""The options that say which federation runs: the backend, the sites, the rounds, weak sites and
personal models, where the run is kept and where the in-process nodes compute."""

from __future__ import annotations

from dataclasses import dataclass

from fed_auc.algorithms import ALGORITHMS
from fed_auc.coordinator.local_work import LocalWork
from fed_auc.exchange.compression import MODES
from fed_auc.experiment.kinds import Integer, Interval, OneOf, Parsed
from fed_auc.experiment.option import option
from fed_auc.node.compute import PRECISIONS, check_device


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",")]


def _comma_ints(text: str) -> list[int]:
    return [int(item) for item in _comma_list(text)]


@dataclass
class FederationOptions:
    """Which federation: backend, sites, rounds, participation; weak sites; compute."""

    algorithm: str = option(
        "codasca",
        help="the federated min-max backend",
        group="federation",
        check=OneOf(lambda: sorted(ALGORITHMS)),
        doc="the federated backend (what each one is: researcher.md, Algorithms)",
    )
    sites: int = option(
        4,
        help="number of synthetic hospital sites",
        group="federation",
        doc="number of synthetic hospitals: the profiles in `hospitals/`, then seeded scanner "
        "variants of them (up to 1024); a file source is split into this many sites",
        simulated=True,
    )
    site_files: list[str] | None = option(
        None,
        help="a site file (repeatable): run exactly these hospitals, each with its own data, as "
        "`fed-auc node --site FILE` serves it over Flower",
        group="federation",
        flag="--site",
        metavar="FILE",
        repeat=True,
        doc="a site file (repeatable): run exactly these hospitals, each with its own data, "
        "splits and node settings, as `fed-auc node --site FILE` serves it over Flower "
        "([hospitals/README.md](../hospitals/README.md)); sites run in `[node] index` order, "
        "then by name. `--sites-dir DIR` adds every `*.toml` of `DIR`",
        simulated=True,
    )
    rounds: int = option(20, help="communication rounds", group="federation", check=Integer(1))
    local_steps: int = option(
        8, help="local steps I between two communications", group="federation", check=Integer(1)
    )
    local_steps_range: str | None = option(
        None,
        help="MIN:MAX: each site draws its local steps τ_i per round from this range (seeded)",
        group="federation",
        check=Parsed(lambda text: LocalWork.from_range(text, seed=0), "MIN:MAX"),
        doc="`MIN:MAX`: each site draws its own τ_i per round (seeded); recorded per site and "
        "round",
    )
    site_local_steps: list[int] | None = option(
        None,
        help="a fixed τ_i per site, comma-separated, in site order",
        group="federation",
        parse=_comma_ints,
        simulated=True,
    )
    participation: float = option(
        1.0,
        help="fraction of sites sampled per round (seeded)",
        group="federation",
        check=Interval(0, 1, "(]"),
    )
    compress: str = option(
        "none",
        help="how train requests and replies travel: none, fp16 or int8 (an update's values, "
        "stochastically rounded per row)",
        group="federation",
        check=OneOf(MODES),
        doc="what train requests and replies carry on the wire: `fp16` (2× fewer bytes) or "
        "`int8` (per-row scale, stochastic rounding: unbiased; ~4× fewer); a reply carries its "
        "update from the broadcast, added back to the exact model; after DP noise (ε "
        "unchanged); evaluation requests stay fp32; with `--secure-aggregation` `fp16` is the "
        "masked vector's fixed point (32-bit words instead of 64), `int8` is refused "
        "([BENCHMARKS.md](../BENCHMARKS.md#compression-on-the-wire-benchmarkssystemscompressionpy))",
    )
    seed: int = option(
        0,
        help="seed of the data, the sampling, the initialization and the participation",
        group="federation",
    )
    hold_out: list[str] | None = option(
        None,
        help="external validation: train without this site (repeatable), then score the "
        "exported model at every site",
        group="federation",
        metavar="SITE",
        repeat=True,
        doc="external validation: the site never trains (it joins over Flower, and is scored); "
        "after training the exported model is scored at every site (repeatable; an empty list "
        "in a config file scores it everywhere with none held out)",
    )
    experiment: str | None = option(
        None,
        help="name of the study this run belongs to, recorded with it (the dashboard's access "
        "file can restrict an experiment's runs to some people)",
        group="federation",
    )
    runs_dir: str = option(
        "runs", help="where the run store and the run folders live", group="compute"
    )
    transport: str = "local"  # local (in-process) or flower: set by the command, not a person
    # EmbracingFL: each site trains the output-side suffix its memory budget allows.
    partial_training: bool = option(
        False,
        help="EmbracingFL: weak sites train only the output-side layer groups their memory fits",
        group="weak_sites",
    )
    site_memory: list | None = option(  # items: float, int or str
        None,
        help="per-site memory budgets, comma-separated: a fraction of a full step (0.15), bytes "
        "or 64MiB",
        group="weak_sites",
        parse=_comma_list,
        default_doc="with `--partial-training`: strong (full), moderate (0.4) and weak (0.15) "
        "tiers",
        simulated=True,
    )
    personalize: str | None = option(
        None,
        help="LSGD-PFL personal models: a personal head, or an l2 pull towards the shared model",
        group="weak_sites",
        check=OneOf(("head", "l2")),
    )
    personal_lambda: float = option(
        1.0,
        help="λ of --personalize l2",
        group="weak_sites",
    )
    personal_lr_ratio: float | None = option(
        None,
        help="--personalize head: the head's lr over the shared lr",
        group="weak_sites",
        default_doc="the number of sites",
    )
    device: str = option(
        "auto",
        help="where the in-process nodes compute: auto (CUDA when usable), cpu, cuda or cuda:N; "
        "a CUDA device torch cannot use is an error; a site file's [node] device wins for its "
        "site",
        group="compute",
        check=Parsed(check_device, "auto, cpu, cuda or cuda:N"),
        doc="where the in-process nodes compute: `auto` (CUDA when usable), `cpu`, `cuda` or "
        "`cuda:N`; a site file's `[node] device` wins for its site; over Flower only the nodes "
        "choose ([operator.md](operator.md))",
    )
    precision: str = option(
        "fp32",
        help="fp32, or bf16/fp16 autocast for the network (a, b, α and what travels stay fp32; "
        "fp16 with a loss scale)",
        group="compute",
        check=OneOf(PRECISIONS),
    )

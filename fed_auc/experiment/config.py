"""The experiment: every option of a federated run, shared by ``fed-auc simulate`` and
``fed-auc coordinator`` and validated before anything starts.

``ExperimentConfig`` is what a run records in the store (``runs.config``); ``recorded_config``
reads it back to resume the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fed_auc.algorithms import ALGORITHMS
from fed_auc.algorithms.base import DUAL_LR_PREVALENCE
from fed_auc.data.spec import parse_data_spec
from fed_auc.experiment.checks import ExperimentChecks, check_type
from fed_auc.experiment.data_options import DataOptions
from fed_auc.experiment.derived import DerivedSettings
from fed_auc.experiment.federation_options import FederationOptions
from fed_auc.experiment.option import simulated_federation
from fed_auc.experiment.protection_options import ProtectionOptions
from fed_auc.experiment.training_options import TrainingOptions

DEFAULT_FILE_SELECT = "best_val:5"
DEFAULT_FILE_NEG_FLOOR = 0.25
# The recipe each kind of data gets for the options not given (None until the kind is known).
# Synthetic: the demo's fast one. Image files: the README's BreastMNIST recipe (a small
# DenseNet, 10 fedavg + CE warm-up rounds before an AUC loss, lr 0.2), which BENCHMARKS.md ran
# on every BreastMNIST federation ("Rare positives", "The README's real-data recipe": CODASCA
# level with FedAvg-CE at 1–2 %, 5 %, 10 % and balanced). Its screens: lr 0.1 lost 0.05
# validation AUC against 0.2, and no warm-up was 0.02 behind 5 rounds (interval holding 0).
SYNTHETIC_RECIPE = {"model": "tiny", "lr": 0.1, "warmup_rounds": 0, "early_stop": 0}
FILE_RECIPE = {"model": "small", "lr": 0.2, "warmup_rounds": 10, "early_stop": 10}


@dataclass
class ExperimentConfig(
    DerivedSettings, ExperimentChecks, ProtectionOptions, DataOptions, TrainingOptions,
    FederationOptions,
):  # fmt: skip
    """Every option of an experiment, for ``fed-auc simulate`` and ``fed-auc coordinator``
    alike, each declared once (``option(...)`` in the ``*_options`` modules: its flag, its
    config-file key, its check and its row in docs/options.md). Defaults follow DESIGN.md and
    the reference code.

    ``transport`` says how the sites run: ``local`` (in-process: the synthetic federation, a
    shared data set split by ``partition``, or the ``site_files`` given) or ``flower`` (each
    node owns its data, so every option that describes a simulated federation is refused).
    Defaults that depend on the kind of data (``model``, ``lr``, ``warmup_rounds``,
    ``early_stop``, ``warmup_head``, ``select``, ``min_neg_fraction``, ``augment``, ``dual_lr``)
    are filled in when the kind is known: at construction for a data spec, by
    ``resolve_files`` for site files and an ``init`` file, after the nodes register for
    ``flower`` (``with_data_kind``).
    An option given (flag or TOML key) always wins. Building a config reads no file.
    """

    def __post_init__(self) -> None:
        if self.loss is None:
            backend = ALGORITHMS.get(self.algorithm)  # an unknown one is refused by name below
            self.loss = "ce" if backend and not backend.needs_minimax_loss else "auc_margin"
        for f in dataclasses.fields(self):
            check_type(f.name, getattr(self, f.name), f.type)
        if self.site_files is not None:
            self.sites = len(self.site_files)
        synthetic = self.data_is_synthetic()
        if synthetic is not None:
            self._fill_data_defaults(synthetic)
        self.validate()

    def resolve_files(self) -> ExperimentConfig:
        """Read the files the options name, once, before the run starts: ``init`` made absolute
        (a resume or the ServerApp runs elsewhere) and its network taken when ``model`` is not
        given; the site files' kind of data fills the data-dependent defaults. Returns self."""
        if self.init is not None:
            from pathlib import Path

            if not Path(self.init).exists():
                raise ValueError(f"init: no such file or folder {self.init!r}")
            self.init = str(Path(self.init).resolve())
            if self.model is None:
                from fed_auc.registry.init_weights import read_init

                self.model = read_init(self.init).arch  # the file's network, not the recipe's
        if self.site_files is not None and self.transport == "local":
            from fed_auc.site import load_site_files

            self._fill_data_defaults(all(s.synthetic for s in load_site_files(self.site_files)))
        self.validate()
        return self

    def data_is_synthetic(self) -> bool | None:
        """Whether the sites' images are generated; None while unknown (Flower, before the
        nodes register; site files, before ``resolve_files`` reads them)."""
        if self.transport != "local" or self.site_files is not None:
            return None
        try:
            return parse_data_spec(self.data).kind == "synthetic"
        except (AttributeError, ValueError):  # not a spec: validate() says so, by name
            return None

    def with_data_kind(self, synthetic: bool) -> ExperimentConfig:
        """A copy with the data-dependent defaults filled in (Flower: after registration)."""
        config = dataclasses.replace(self)
        config._fill_data_defaults(synthetic)
        config.validate()
        return config

    def data_defaults_pending(self) -> bool:
        """Whether options still wait for the data's kind (Flower, before registration)."""
        return None in (self.model, self.lr, self.warmup_rounds)

    def _fill_data_defaults(self, synthetic: bool) -> None:
        recipe = SYNTHETIC_RECIPE if synthetic else FILE_RECIPE
        if self.model is None:
            self.model = recipe["model"]
        if self.lr is None:
            self.lr = recipe["lr"]
        auc_phase = not synthetic and self.loss != "ce"  # the AUC recipe of BENCHMARKS.md
        if self.warmup_rounds is None:
            warm = auc_phase and not self._accounted()
            self.warmup_rounds = recipe["warmup_rounds"] if warm else 0
        if self.select is None:
            self.select = "best_val" if synthetic else DEFAULT_FILE_SELECT
        if self.early_stop is None:
            self.early_stop = recipe["early_stop"]
        if self.min_neg_fraction is None:
            self.min_neg_fraction = 0.0 if synthetic else DEFAULT_FILE_NEG_FLOOR
        if self.augment is None:
            self.augment = "none" if synthetic else "flip"
        if self.warmup_head is None:
            self.warmup_head = "recenter" if auc_phase and self.warmup_rounds else "keep"
        if auc_phase and ALGORITHMS[self.algorithm].prevalence_dual_step:
            self.backend_options = {"dual_lr": DUAL_LR_PREVALENCE, **self.backend_options}

    def _accounted(self) -> bool:
        """Whether a DP accountant runs (DP-SGD, or noised update-level DP): no warm-up then."""
        if self.dp == "example":
            return True
        return self.dp_clip is not None and bool(self.dp_noise or self.target_epsilon is not None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The options that describe a simulated federation: refused over Flower, where each node owns
# its data (its site file).
SIMULATED_FEDERATION = simulated_federation(ExperimentConfig)

"""The experiment config's checks: each option validated early, alone and against the others, with
the option's name, the bad value and what was expected.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

from fed_auc.algorithms import ALGORITHMS, build_backend
from fed_auc.algorithms.partial import parse_budget
from fed_auc.coordinator.policy import COMPRESS_WITH_SECURE
from fed_auc.coordinator.robust import Aggregation
from fed_auc.data.labels import (
    validate_classes,
    validate_positive_class,
    validate_positive_label,
)
from fed_auc.data.spec import parse_data_spec
from fed_auc.data.synthetic import MAX_SITES as MAX_SYNTHETIC_SITES
from fed_auc.experiment.kinds import Integer, OneOf
from fed_auc.experiment.option import declared_options, simulated_federation
from fed_auc.node.compute import AUTO

TRANSPORTS = ("local", "flower")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list[int]": (list,),
    "list[str]": (list,),
    "list": (list,),  # checked item by item by the option's own validation
    "dict[str, Any]": (dict,),
}


def check_type(name: str, value: Any, annotation: str) -> None:
    """``value`` matches a field annotation such as ``float | None`` (bool is not a number)."""
    kinds = [kind.strip() for kind in str(annotation).split("|")]
    if value is None:
        if "None" in kinds:
            return
    elif any(
        isinstance(value, _TYPES[kind]) and (kind == "bool" or not isinstance(value, bool))
        for kind in kinds
        if kind in _TYPES
    ):
        if "list[int]" not in kinds or all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return
    raise ValueError(f"{name} must be {annotation}, got {value!r} ({type(value).__name__})")


class ExperimentChecks:
    """``ExperimentConfig``'s checks, as a mixin: each option validated early, alone and
    against the others, naming the option, the bad value and what was expected."""

    def validate(self) -> None:
        """Fail early with the option name, the bad value and what was expected.

        Before the data's kind is known (Flower, before the nodes register) the options it fills
        in are checked as either kind would fill them: refused only if both refuse (image files'
        reason shown); ``with_data_kind`` checks again once the kind is known."""
        if self.data_defaults_pending():
            errors = []
            for synthetic in (False, True):
                filled = copy.copy(self)
                filled._fill_data_defaults(synthetic)
                try:
                    return filled.validate()
                except ValueError as exc:
                    errors.append(exc)
            raise errors[0]
        for name, (f, declared) in declared_options(type(self)).items():
            value = getattr(self, name)
            check_type(name, value, f.type)
            if declared is not None and declared.check is not None and value is not None:
                declared.check(name, value)
        if ALGORITHMS[self.algorithm].needs_minimax_loss and self.loss == "ce":
            raise ValueError(
                f"algorithm {self.algorithm!r} is a min-max AUC method: use --loss auc_margin "
                "or auc_square (cross-entropy works with fedavg only)"
            )
        OneOf(TRANSPORTS)("transport", self.transport)
        self._check_compute()
        self._check_sites_option()
        synthetic = parse_data_spec(self.data).kind == "synthetic"
        Integer(1, MAX_SYNTHETIC_SITES if synthetic else None)("sites", self.sites)
        validate_classes(self.classes, validate_positive_label(self.positive_label))
        validate_positive_class(self.positive_class)
        if synthetic and self.positive_class is not None:
            raise ValueError(
                f"positive_class {self.positive_class!r} names a file source's positive class; "
                "the synthetic federation's positives are its findings"
            )
        if synthetic and self.positive_label is not None:
            raise ValueError(
                f"positive_label {self.positive_label!r} applies to file sources (--data "
                "medmnist:PATH or csv:PATH); the synthetic federation's positives are its findings"
            )
        if self.warmup_head not in (None, "keep") and not self.warmup_rounds:
            raise ValueError(
                f"warmup_head = {self.warmup_head!r} needs warmup_rounds ≥ 1 (a warm-up whose "
                "classifier to change)"
            )
        floors = math.ceil(self.min_pos_fraction * self.batch_size) + math.ceil(
            (self.min_neg_fraction or 0) * self.batch_size
        )
        if floors > self.batch_size:
            raise ValueError(
                f"min_pos_fraction {self.min_pos_fraction!r} and min_neg_fraction "
                f"{self.min_neg_fraction!r} floor {floors} rows of a batch of {self.batch_size}"
            )
        if self.site_local_steps is not None and len(self.site_local_steps) != self.sites:
            raise ValueError(
                f"site_local_steps needs one value per site ({self.sites}), "
                f"got {self.site_local_steps!r}"
            )
        if self.site_local_steps is not None and self.local_steps_range is not None:
            raise ValueError("give site_local_steps or local_steps_range, not both")
        self._check_dp()
        if self.site_memory is not None and not self.partial_training:
            raise ValueError("site_memory needs partial_training (--partial-training)")
        for i, budget in enumerate(self.memory_budgets()):
            if budget is not None:
                parse_budget(budget, f"site_memory[{i}]")
        if self.site_memory is not None and len(self.site_memory) != self.sites:
            raise ValueError(
                f"site_memory needs one budget per site ({self.sites}), got {self.site_memory!r}"
            )
        personalization = self.personalization()
        if personalization is not None:
            personalization.check_backend(
                build_backend(self.algorithm, **self.backend_hyperparameters())
            )
        backend = build_backend(self.algorithm, **self.backend_hyperparameters())  # validates
        Aggregation.parse(self.aggregation).check_backend(backend)
        if self.dp != "example" and self.dp_clip is not None and backend.refuses_update_dp:
            raise ValueError(
                f"dp_clip cannot be used with {self.algorithm!r}: {backend.refuses_update_dp}"
            )
        self._check_secure_aggregation(backend)

    def _check_secure_aggregation(self, backend) -> None:
        """Refuse, by name and with the reason, what secure aggregation cannot do."""
        if self.secure_aggregation and self.compress == "int8":
            raise ValueError(COMPRESS_WITH_SECURE)
        if not self.secure_aggregation:
            for name in ("secure_aggregation_threshold", "secure_aggregation_neighbours"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} needs secure_aggregation")
            return
        try:
            from fed_auc.coordinator.secure_phase import SecureAggregation, refuse_options
        except ImportError as exc:
            raise ValueError(
                f"secure_aggregation needs the cryptography and flwr packages ({exc}): "
                "pip install 'fed-auc[secure-aggregation]'"
            ) from None

        settings = SecureAggregation(
            self.secure_aggregation_threshold, self.secure_aggregation_neighbours
        )
        refuse_options(self.aggregation, self.max_update_norm, backend)
        if self.transport != "local":
            return  # the sites are known once they register (the coordinator checks)
        sampled = max(1, math.ceil(self.participation * self.sites))
        if sampled < 2:
            raise ValueError(
                f"secure_aggregation needs at least 2 sampled sites: {sampled} of "
                f"{self.sites} sites are sampled (participation {self.participation})"
            )
        try:
            k = settings.neighbours_for([""] * sampled)
        except RuntimeError as exc:  # SecureAggregationError, loaded only with the option
            raise ValueError(str(exc)) from None
        threshold = settings.threshold_for([""] * sampled)
        if threshold > k + 1:
            raise ValueError(
                f"secure_aggregation_threshold {threshold} is larger than a site's "
                f"neighbourhood: itself and {k} neighbours of the {sampled} sampled sites "
                f"({self.sites} sites, participation {self.participation})"
            )

    def _check_dp(self) -> None:
        if self.dp == "example" and self.norm == "batch":
            raise ValueError(
                "norm = 'batch' cannot be used with dp = 'example': BatchNorm mixes the examples "
                "of a batch, so no gradient is one example's; use norm = 'group'"
            )
        if self.dp == "example":
            if self.dp_clip is None:
                raise ValueError("dp = 'example' needs dp_clip (C, each example's clip norm)")
            self.example_dp()  # validates dp_clip, dp_noise / target_epsilon and dp_delta
            if self.warmup_rounds:
                raise ValueError(
                    f"warmup_rounds = {self.warmup_rounds}: the warm-up trains on site data "
                    "outside the run's DP accountant; set it to 0 with dp = 'example'"
                )
            return
        if self.dp_clip is None:
            if self.dp == "update":
                raise ValueError("dp = 'update' needs dp_clip (C, the update's clip norm)")
            if self.dp_noise:
                raise ValueError("dp_noise needs dp_clip (the noise is σ · C)")
            if self.target_epsilon is not None:
                raise ValueError(
                    f"target_epsilon = {self.target_epsilon!r} needs dp_clip (dp = 'update' or "
                    "'example')"
                )
            return
        if not self.update_dp().accounted:  # validates dp_clip, dp_noise / target_epsilon, δ
            return  # clipping only: no noise, no ε
        if self.norm == "batch":
            raise ValueError(
                "norm = 'batch' cannot be used with dp = 'update' and noise: BatchNorm's running "
                "statistics leave the node un-noised, outside the accountant; use norm = 'group'"
            )
        if self.warmup_rounds:
            raise ValueError(
                f"warmup_rounds = {self.warmup_rounds}: the warm-up trains on site data "
                "outside the run's DP accountant; set it to 0 with dp = 'update' and noise"
            )

    def _check_compute(self) -> None:
        """The in-process nodes' device and precision; over Flower they are each node's."""
        if self.transport != "local" and (self.device, self.precision) != (AUTO, "fp32"):
            raise ValueError(
                f"device = {self.device!r}, precision = {self.precision!r}: over Flower each "
                "node's operator chooses them ([node] device and precision in its site file, "
                "or fed-auc node --device/--precision); a coordinator never sets them"
            )

    def _check_sites_option(self) -> None:
        """Options that describe a simulated federation: refused where sites own their data."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        simulated = [
            name
            for name in simulated_federation(type(self))
            if name != "sites" and getattr(self, name) != defaults[name]
        ]
        if self.transport != "local":  # the nodes own their data
            simulated += ["sites"] if self.sites != defaults["sites"] else []
            if simulated:
                raise ValueError(
                    f"{sorted(simulated)} describe a simulated federation; over Flower each "
                    "node owns its data (its site file): remove them"
                )
            return
        if self.site_files is None:
            return
        if not isinstance(self.site_files, list) or not self.site_files:
            raise ValueError(
                f"site_files must be a non-empty list of paths, got {self.site_files!r}"
            )
        clash = [name for name in simulated if name not in ("data_scale", "site_files")]
        if clash:
            raise ValueError(
                f"site_files define each site's data and node; {sorted(clash)} cannot be "
                "given with them (set them in the site files)"
            )

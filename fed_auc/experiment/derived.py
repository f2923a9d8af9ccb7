"""What an experiment's options make for the parts that run it: the backend's hyperparameters,
the DP settings, the network's normalization, each node's setup, per-site local work. A mixin of
``ExperimentConfig``, computed from its fields, never stored."""

from __future__ import annotations

import dataclasses
from typing import Any

from fed_auc.algorithms import ALGORITHMS, hyperparameter_names
from fed_auc.algorithms.personal import Personalization
from fed_auc.coordinator.local_work import LocalWork
from fed_auc.node.setup import NodeSetup
from fed_auc.privacy.accounting import RELATIONS
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.update_dp import UpdateDP
from fed_auc.tta import default_tta


class DerivedSettings:
    """The settings an ``ExperimentConfig`` hands to the backend, the nodes and the card."""

    def example_dp(self) -> ExampleDP | None:
        """DP-SGD's settings (dp = 'example'), planned for every round's local steps."""
        if self.dp != "example":
            return None
        steps = max([self.local_steps, *(self.site_local_steps or [])])
        if self.local_steps_range is not None:
            steps = max(steps, int(self.local_steps_range.split(":")[-1]))
        return ExampleDP(
            clip=self.dp_clip,
            noise_multiplier=self.dp_noise or None,
            delta=self.dp_delta,
            target_epsilon=self.target_epsilon,
            rounds=self.rounds,
            local_steps=steps,
        )

    def update_dp(self) -> UpdateDP | None:
        """Update-level DP's settings (dp_clip without dp = 'example'), planned for every
        round's phases (``PrivateUpdates``): a site may take part in all of them."""
        if self.dp == "example" or self.dp_clip is None:
            return None
        return UpdateDP(
            clip=self.dp_clip,
            noise_multiplier=self.dp_noise,
            delta=self.dp_delta,
            target_epsilon=self.target_epsilon,
            rounds=self.rounds,
        )

    def dp_relation(self) -> str | None:
        """The neighbouring relation this run's ε is for (None: no ε is accounted)."""
        if self.dp == "example":
            return RELATIONS["example"]
        update = self.update_dp()
        return RELATIONS["update"] if update is not None and update.accounted else None

    def model_norm(self) -> str:
        """The network's normalization: GroupNorm under DP-SGD (BatchNorm mixes examples) and
        under noised update-level DP (BatchNorm's statistics would leave un-noised)."""
        if self.norm is not None:
            return self.norm
        update = self.update_dp()
        private = self.dp == "example" or (update is not None and update.accounted)
        return "group" if private else "batch"

    def backend_hyperparameters(self) -> dict[str, Any]:
        common = {
            "lr": self.lr,
            "local_steps": self.local_steps,
            "lr_decay": self.lr_decay,
            "decay_every": self.decay_every,
            "weight_decay": self.weight_decay,
            "grad_clip": self.grad_clip,
        }
        accepted = hyperparameter_names(ALGORITHMS[self.algorithm])
        specific = {"gamma": self.gamma, "eta_g": self.eta_g, "seed": self.seed}
        common.update({k: v for k, v in specific.items() if k in accepted})
        if self.stage_output is not None:  # refused by backends without stages
            common["stage_output"] = self.stage_output
        return {**common, **self.backend_options}

    def augmentation(self) -> str:
        """The augmentation in effect (filled in with the data's default once it is known)."""
        if self.augment is None:
            raise ValueError("augment is not known before the data's kind (with_data_kind)")
        return self.augment

    def test_time_augmentation(self) -> str:
        """The TTA in effect: the chosen one, or flip when the training batches are flipped."""
        return default_tta(self.augmentation()) if self.tta is None else self.tta

    def memory_budgets(self) -> list[float | int | str | None]:
        """Per-site budgets: given, or strong (full), moderate (40 %) and weak (15 %) sites."""
        if not self.partial_training:
            return [None] * self.sites
        if self.site_memory is not None:
            return list(self.site_memory)
        tier = self.sites // 3
        return [1.0] * (self.sites - 2 * tier) + [0.4] * tier + [0.15] * tier

    def personalization(self, num_sites: int | None = None) -> Personalization | None:
        """LSGD-PFL's setting; the head's lr ratio defaults to the number of sites M."""
        if self.personalize is None:
            return None
        ratio = self.personal_lr_ratio
        if ratio is None:
            ratio = self.sites if num_sites is None else num_sites
        return Personalization(self.personalize, self.personal_lambda, ratio)

    def node_setup(
        self, run_id: str, model_config: dict[str, Any], num_labels: int, num_sites: int
    ) -> NodeSetup:
        """What every node of this experiment needs (JSON-able, sent with each Flower request)."""
        personalization = self.personalization(num_sites)
        example, update = self.example_dp(), self.update_dp()
        return NodeSetup(
            run_id=run_id,
            algorithm=self.algorithm,
            hyperparameters=self.backend_hyperparameters(),
            model_config=model_config,
            loss=self.loss,
            batch_size=self.batch_size,
            min_pos_fraction=self.min_pos_fraction,
            min_neg_fraction=self.min_neg_fraction,
            augment=self.augmentation(),
            tta=self.test_time_augmentation(),
            seed=self.seed,
            image_size=self.image_size,
            num_labels=num_labels,
            data_scale=self.data_scale,
            update_dp=dataclasses.asdict(update) if update else None,
            example_dp=dataclasses.asdict(example) if example else None,
            partial_training=self.partial_training,
            personalize=self.personalize,
            personal_lambda=self.personal_lambda,
            personal_lr_ratio=personalization.lr_ratio if personalization else 1.0,
            rounds=self.rounds,
        )

    def local_work(
        self, site_names: list[str], fixed: dict[str, int] | None = None
    ) -> LocalWork | None:
        """Per-site τ_i, or None when every site does the backend's ``local_steps``.
        ``fixed``: sites whose own file sets their τ_i (they keep it whatever the range)."""
        fixed = dict(fixed or {})
        if self.site_local_steps is not None:
            fixed.update(zip(site_names, self.site_local_steps, strict=True))
        if self.local_steps_range is not None:
            work = LocalWork.from_range(self.local_steps_range, seed=self.seed)
            return dataclasses.replace(work, fixed=fixed)
        return LocalWork(fixed=fixed) if fixed else None

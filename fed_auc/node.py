"""A hospital node: its own data, a warm model, and local state that survives restarts.

The node answers two requests, whatever the transport: ``train`` (run the backend's
``client_update`` on local data) and ``evaluate`` (score a model on local splits). Only
tensors of the model update and aggregate counts leave it; per-image scores leave only when
the request asks for pooled scoring (simulation does, to report pooled AUC).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.algorithms.base import Backend, Broadcast, Reply
from fed_auc.data.base import SiteData, Split
from fed_auc.data.sampling import BatchStream
from fed_auc.io import load_state, save_state
from fed_auc.losses import build_loss
from fed_auc.metrics import AUCResult, per_label_auc
from fed_auc.models import model_from_config
from fed_auc.partial import choose_groups, memory_table, parse_budget
from fed_auc.personal import Personalization
from fed_auc.trainable import Tensors, Trainable

LOCAL_STATE_FILE = "local_state.pt"
EVAL_BATCH = 256


@dataclass
class SplitEvaluation:
    """A model scored on one split of one site."""

    n: int
    positives: list[int]
    aucs: list[AUCResult]
    scores: np.ndarray | None = None  # (N, L), only when pooled scoring is on
    labels: np.ndarray | None = None


@dataclass
class Evaluation:
    site: str
    splits: dict[str, SplitEvaluation] = field(default_factory=dict)
    duration_s: float = 0.0
    personal: dict[str, SplitEvaluation] | None = None  # the site's personal model, if any


class Node:
    """One site's participant in the federation."""

    def __init__(
        self,
        site: SiteData,
        backend: Backend,
        model_config: dict[str, Any],
        loss_name: str,
        state_dir: str | Path,
        batch_size: int = 32,
        min_pos_fraction: float = 0.05,
        seed: int = 0,
        memory_budget: float | int | str | None = None,
        personalization: Personalization | None = None,
    ) -> None:
        self.site = site
        self.backend = backend
        self.state_path = Path(state_dir) / LOCAL_STATE_FILE
        model = model_from_config(model_config)
        loss = build_loss(loss_name, site.num_labels, [0.5] * site.num_labels)
        self.trainable = Trainable(model, loss)
        if memory_budget is not None:  # partial training: the suffix the budget allows
            where = f"site {site.name!r} memory_budget"
            table = memory_table(model_config, batch_size, int(site.train.images.shape[-1]))
            groups = choose_groups(table, parse_budget(memory_budget, where), where)
            if groups is not None:
                self.trainable.train_only(groups)
        self.personalization = personalization
        if personalization is not None:
            personalization.check_backend(backend)
            personalization.setup(self.trainable)
        self._local_state: dict[str, Any] | None = None  # in memory; on disk after each round
        self._personal: dict[str, Any] = {}  # personal model (personalization), same file
        self.batches = BatchStream(
            site.train, batch_size, seed=seed, min_pos_fraction=min_pos_fraction
        )

    @property
    def name(self) -> str:
        return self.site.name

    def registration(self) -> dict[str, Any]:
        """Aggregate counts the coordinator needs (global prevalence); no images, no labels."""
        split = self.site.train
        return {
            "n": len(split),
            "positives": split.positives(),
            "known": split.known(),
            "trained_groups": self.trainable.trained_groups,
        }

    def _restore(self) -> None:
        """On the first request since start, read the local state that survived."""
        if self._local_state is None:
            saved = load_state(self.state_path) if self.state_path.exists() else {}
            if "sampler" in saved:
                self.batches.load_state_dict(saved["sampler"])
            self._local_state = saved.get("backend", {})
            self._personal = saved.get("personal", {})

    def train(self, broadcast: Broadcast) -> Reply:
        """Run the backend's local update and persist the local state before replying."""
        self._restore()
        if self.trainable.is_minimax:
            self.trainable.loss.set_pos_ratio(broadcast.config["pos_ratio"])
        if self.personalization is None:
            reply, self._local_state = self.backend.client_update(
                broadcast, self._local_state, self.trainable, self.batches
            )
        else:
            reply, self._local_state, self._personal = self.personalization.train(
                self.backend,
                broadcast,
                self._local_state,
                self._personal,
                self.trainable,
                self.batches,
            )
        state = {"backend": self._local_state, "sampler": self.batches.state_dict()}
        if self._personal:
            state["personal"] = self._personal
        save_state(state, self.state_path)
        reply.site = self.name
        reply.num_examples = len(self.site.train)
        reply.trained_groups = self.trainable.trained_groups
        return reply

    @torch.no_grad()
    def evaluate(
        self, tensors: Tensors, splits: tuple[str, ...] = ("val", "test"), pooled: bool = False
    ) -> Evaluation:
        """Score the given model on local splits: AUC with CI per label, and counts."""
        start = time.perf_counter()
        result = Evaluation(self.name, self._score(tensors, splits, pooled))
        if self.personalization is not None:  # and the site's own model, scored here only
            self._restore()
            personal = self.personalization.model(tensors, self._personal)
            if personal is not None:
                result.personal = self._score(personal, splits, pooled=False)
        result.duration_s = time.perf_counter() - start
        return result

    def _score(
        self, tensors: Tensors, splits: tuple[str, ...], pooled: bool
    ) -> dict[str, SplitEvaluation]:
        self.trainable.load(tensors)
        out = {}
        for name in splits:
            split: Split = getattr(self.site, name)
            scores = self.scores(split.images)
            labels = split.labels.numpy()
            out[name] = SplitEvaluation(
                n=len(split),
                positives=split.positives(),
                aucs=per_label_auc(labels, scores),
                scores=scores if pooled else None,
                labels=labels if pooled else None,
            )
        return out

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> np.ndarray:
        """h = sigmoid(logit) for every image, in eval mode."""
        model = self.trainable.model
        model.eval()
        chunks = [images[i : i + EVAL_BATCH] for i in range(0, len(images), EVAL_BATCH)]
        if not chunks:
            return np.zeros((0, self.site.num_labels), dtype=np.float32)
        return torch.cat([torch.sigmoid(model(chunk)) for chunk in chunks]).numpy()

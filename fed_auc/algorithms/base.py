"""The backend contract: four methods, plain data in and out, no I/O.

A round, as the coordinator drives it (one pass per phase in ``phases``):
``plan(state, round, phase) -> Broadcast``, then on every selected node
``client_update(broadcast, local_state, trainable, batches) -> (Reply, local_state)``,
then ``aggregate(state, replies, phase) -> state``. States are dicts of tensors and
scalars so they checkpoint with ``torch.save`` and travel without pickled code.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, Protocol

import torch

from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors, Trainable

ServerState = dict[str, Any]
DUAL = AUC + "alpha"  # the dual variable α (Trainable.dual)
DUAL_LR_PREVALENCE = "prevalence"  # dual_lr scaled to the federation's p (set_prevalence)
LocalState = dict[str, Any]


class Batches(Protocol):
    """A node's local training data as a backend sees it (the node's ``BatchStream``)."""

    def __next__(self) -> Sequence[torch.Tensor]:
        """The next sampled minibatch: (x, y) or a ``Batch`` (x, y, row weights), to be taken
        as drawn with ``trainable.gradients(*batch)``."""

    def full_pass(self, batch_size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """All local training data once, in chunks (for full local gradients)."""


@dataclass(frozen=True)
class Draw:
    """One use of a site's training data in a local update, as DP-SGD's accountant counts it:
    a sampled minibatch (``batch``) or a full pass over the split (``pass``), whose gradients
    are evaluated ``evaluations`` times (e.g. at the iterate and at an anchor)."""

    kind: str
    evaluations: int = 1


def prefixed(prefix: str, tensors: Tensors) -> Tensors:
    return {prefix + name: t for name, t in tensors.items()}


def unprefixed(prefix: str, tensors: Tensors) -> Tensors:
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}


def site_weights(replies: Sequence[Reply], weighting: str) -> list[float]:
    """Aggregation weights: uniform (the CODASCA paper's 1/K) or by number of examples."""
    if weighting == "uniform":
        return [1.0 / len(replies)] * len(replies)
    total = sum(r.num_examples for r in replies)
    return [r.num_examples / total for r in replies]


def weighted_mean(tensor_sets: Sequence[Tensors], weights: Sequence[float]) -> Tensors:
    """Σ_k weight_k · tensors_k, name by name, over the sets that hold the name.

    Partial training (EmbracingFL): a weak site sends only what it trained, so a tensor is
    averaged over the sites that trained it, its weights rescaled to the full total. A name
    every set holds takes the plain sum, so all-full replies give the plain result exactly.
    """
    names = dict.fromkeys(name for tensors in tensor_sets for name in tensors)
    total = sum(weights)
    out = {}
    for name in names:
        holders = [(t, w) for t, w in zip(tensor_sets, weights, strict=True) if name in t]
        scale = 1.0 if len(holders) == len(tensor_sets) else total / sum(w for _, w in holders)
        acc = torch.zeros_like(holders[0][0][name])  # payload tensors are floating point
        for tensors, weight in holders:
            acc.add_(tensors[name], alpha=weight * scale)
        out[name] = acc
    return out


def validate_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def validate_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    is_number = isinstance(value, Real) and not isinstance(value, bool)
    ok = is_number and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def validate_numeric_dual_lr(backend: str, value: object) -> None:
    """A backend whose α step is its own rule takes a number, not ``dual_lr=prevalence``."""
    if value == DUAL_LR_PREVALENCE:
        raise ValueError(
            f"dual_lr = {DUAL_LR_PREVALENCE!r} is not available for {backend}, whose α step "
            "follows its own rule: give a number (the scaling to the prevalence is for codasca, "
            "coda_plus, local_sgda and fedavg)"
        )
    validate_positive("dual_lr", value)


class SecureTotal(Protocol):
    """What secure aggregation reveals (``fed_auc.privacy.secure.encoding.SecureSum``)."""

    sites: tuple[str, ...]
    sums: Tensors

    def mean(self, prefix: str = "", names: Collection[str] | None = None) -> Tensors: ...

    def total(self, name: str) -> torch.Tensor: ...

    def total_weight(self, name: str | None = None) -> float: ...


class Backend(ABC):
    """A federated training algorithm. Subclasses keep their hyperparameters as attributes."""

    name: str = ""
    phases: tuple[str, ...] = ("train",)
    needs_minimax_loss: bool = True
    # Whether α's step is ``dual_lr_of`` (the base's), which ``dual_lr = "prevalence"`` scales
    # to η/(p(1−p)): the default on image files (BENCHMARKS.md, "Rare positives"). False for a
    # backend whose α step follows its own rule (it refuses "prevalence").
    prevalence_dual_step: bool = True
    # Why the backend cannot run under robust aggregation (centered_clip); "" = it can.
    refuses_robust_aggregation: str = ""
    # Why the backend cannot run under update-level DP clipping (dp_clip); "" = it can.
    refuses_update_dp: str = ""
    # Why a personal head (--personalize head) cannot run with the backend; "" = it can.
    refuses_personal_head: str = ""
    # The reply prefix of control-variate changes, whose norm the store records (cv_drift).
    control_delta_prefix: str | None = None

    def __init__(
        self,
        lr: float = 0.1,
        local_steps: int = 8,
        lr_decay: float = 3.0,
        decay_every: int = 4000,
        weight_decay: float = 1e-5,
        grad_clip: float | None = 1.0,
        site_weighting: str = "uniform",
        dual_lr: float | str | None = None,
    ) -> None:
        validate_positive("lr", lr)
        if dual_lr == DUAL_LR_PREVALENCE:
            if lr >= 1:
                raise ValueError(
                    f"dual_lr = {DUAL_LR_PREVALENCE!r} needs lr < 1 (α then contracts by 2η "
                    f"per step, which diverges at η ≥ 1); got lr = {lr!r}"
                )
        elif dual_lr is not None:
            validate_positive("dual_lr", dual_lr)
        if int(local_steps) != local_steps or local_steps < 1:
            raise ValueError(f"local_steps must be an integer ≥ 1, got {local_steps!r}")
        if not (isinstance(lr_decay, Real) and math.isfinite(lr_decay) and lr_decay >= 1):
            raise ValueError(f"lr_decay must be ≥ 1 (1 = no decay), got {lr_decay!r}")
        if int(decay_every) != decay_every or decay_every < 1:
            raise ValueError(f"decay_every must be an integer ≥ 1 step, got {decay_every!r}")
        validate_positive("weight_decay", weight_decay, allow_zero=True)
        if grad_clip is not None:
            validate_positive("grad_clip", grad_clip)
        validate_choice("site_weighting", site_weighting, ("uniform", "examples"))
        self.lr = lr
        self.local_steps = int(local_steps)
        self.lr_decay = lr_decay
        self.decay_every = int(decay_every)
        self.weight_decay = weight_decay
        self.grad_clip = grad_clip
        self.site_weighting = site_weighting
        # α's own step size (issue 18 item 9): None = the paper's single step size η.
        # E[∂F/∂α] = 2p(1−p)(m + μ⁻ − μ⁺ − α): with one η, α closes a fraction 2ηp(1−p) of
        # its gap per step. "prevalence": η / max_l p_l(1 − p_l), so that fraction is 2η at
        # any p (``set_prevalence``, once the sites' counts give p).
        self.dual_lr = dual_lr
        self._dual_lr_value: float | None = None if dual_lr == DUAL_LR_PREVALENCE else dual_lr

    def hyperparameters(self) -> dict[str, Any]:
        """Everything that defines the run, for the store and the model card."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def stage_of(self, round_: int) -> int:
        """Stage s of a round: the learning rate is divided by ``lr_decay`` every T0 steps."""
        return (round_ * self.local_steps) // self.decay_every

    def lr_of(self, round_: int) -> float:
        return self.lr / self.lr_decay ** self.stage_of(round_)

    def dual_lr_of(self, round_: int) -> float:
        """α's step size in ``round_``: ``dual_lr`` (η if None), decayed like η."""
        if self.dual_lr == DUAL_LR_PREVALENCE and self._dual_lr_value is None:
            raise RuntimeError("dual_lr = 'prevalence' needs set_prevalence() before a round")
        dual = self.lr if self._dual_lr_value is None else self._dual_lr_value
        return dual / self.lr_decay ** self.stage_of(round_)

    def set_prevalence(self, pos_ratio: Sequence[float]) -> None:
        """Resolve ``dual_lr = "prevalence"`` from the federation's p per label.

        E[∂F/∂α] = 2p(1−p)(α* − α), so α's step η / (p(1−p)) makes α contract towards α*
        by 2η per step whatever the prevalence; the paper's single η makes that 2ηp(1−p),
        20× less at p = 5 % (BENCHMARKS.md "Rare positives"). With several labels the
        largest p(1−p) sets it, so no label overshoots."""
        if self.dual_lr == DUAL_LR_PREVALENCE:
            self._dual_lr_value = self.lr / max(p * (1 - p) for p in pos_ratio)

    @abstractmethod
    def init_server(self, trainable: Trainable, site_sizes: Mapping[str, int]) -> ServerState:
        """The initial server state; ``site_sizes`` = training examples per site (all sites)."""

    @abstractmethod
    def plan(self, state: ServerState, round_: int, phase: str = "train") -> Broadcast: ...

    @abstractmethod
    def client_update(
        self,
        broadcast: Broadcast,
        local_state: LocalState,
        trainable: Trainable,
        batches: Batches,
    ) -> tuple[Reply, LocalState]: ...

    @abstractmethod
    def aggregate(
        self, state: ServerState, replies: Sequence[Reply], phase: str = "train"
    ) -> ServerState: ...

    def register_sites(
        self, state: ServerState, registrations: Mapping[str, Mapping[str, Any]]
    ) -> ServerState:
        """The state with what every site declared when it registered (its ``n``, its
        ``trained_groups`` under partial training); called once, right after ``init_server``."""
        return state

    def reply_sent(
        self, computed: Reply, sent: Reply, broadcast: Broadcast, local_state: LocalState
    ) -> LocalState:
        """The node's local state once its reply was changed before leaving (DP clipping and
        noise): ``computed`` is what ``client_update`` returned, ``sent`` what travels."""
        return local_state

    def reply_layout(self, phase: str = "train") -> ReplyLayout:
        """What a valid reply of ``phase`` carries (checked before ``aggregate``)."""
        return ReplyLayout()

    def secure_layout(self, phase: str = "train") -> ReplyLayout:
        """What a node sums under secure aggregation: its reply's layout plus what the server
        would otherwise derive from the reply (``complete_reply``), which the node computes."""
        return self.reply_layout(phase)

    def site_weight(self, num_examples: int) -> float:
        """w_k of a site in the server's weighted means: 1 (uniform) or its examples. Under
        secure aggregation it is public (the site's registered n), so the node scales by it."""
        return 1.0 if self.site_weighting == "uniform" else float(num_examples)

    def aggregate_secure(
        self, state: ServerState, total: SecureTotal, phase: str = "train"
    ) -> ServerState:
        """``aggregate`` from sums only (secure aggregation): ``total`` holds Σ_k w_k x_k per
        tensor, Σ w_k over the sites that sent it, and the sites summed. A backend whose
        aggregate needs one reply's values cannot run under secure aggregation."""
        raise NotImplementedError(f"{self.name!r} does not aggregate from sums")

    def complete_reply(self, reply: Reply, broadcast: Broadcast) -> Reply:
        """The reply with what the server can derive from it and the ``broadcast`` it answers
        (such tensors need not travel); called on every valid reply before ``aggregate``."""
        return reply

    def private_draws(self, phase: str, local_steps: int) -> list[Draw]:
        """What one ``client_update`` of ``phase`` draws from the site's data, for DP-SGD's
        planner (``accounting.example_plan``): by default one minibatch per local step,
        evaluated once. A test runs every backend and compares this with its ledger."""
        return [Draw("batch")] * local_steps

    def with_local_steps(self, state: ServerState, steps: Mapping[str, int]) -> ServerState:
        """``state`` told the τ_i that every site runs in the round being planned, sampled or
        not: the coordinator knows them all (the backend's I, fixed per site, or drawn seeded
        per site and round). Called after ``plan`` for a phase that asks for local steps, so
        ``aggregate`` may use them; backends that need no τ_i return ``state`` unchanged."""
        return state

    def check_reply(self, reply: Reply, request: Broadcast) -> None:
        """Raise ``ValueError`` naming a count or scalar of ``reply`` that this backend would
        use and that ``request`` rules out. Called after the generic checks (tensors, finite
        metrics, 1 ≤ steps ≤ the local steps asked for, the registered number of examples)
        and before ``update_norm``; the default has nothing more to check."""
        return None

    def move_rates(
        self, prefix: str, reply: Reply, request: Broadcast
    ) -> tuple[float, float] | None:
        """How a block of the reply (its tensors under ``prefix``) moves the model: None for
        an iterate block (its move is v_k − v), else the (primal, dual) rates of the steps
        that apply a gradient block (move = rate · g). Default: every block is an iterate."""
        return None

    def reply_blocks(self, reply: Reply, request: Broadcast) -> list[ReplyBlock]:
        """The reply's variables (w, a, b, α; not buffers), one block per prefix of its
        layout, each with what turns it into the move it makes the model take."""
        model = model_part(request.tensors)
        blocks = []
        for prefix in self.reply_layout(request.phase).prefixes:
            names = tuple(
                n
                for n, t in reply.tensors.items()
                if n.startswith(prefix)
                and n[len(prefix) :].startswith((WEIGHT, AUC))
                and t.is_floating_point()
            )
            if not names:
                continue
            rates = self.move_rates(prefix, reply, request)
            if rates is None:
                base = {n: model[n[len(prefix) :]] for n in names if n[len(prefix) :] in model}
                if len(base) != len(names):
                    raise ValueError(f"reply block {prefix!r} holds variables the model lacks")
                blocks.append(ReplyBlock(prefix, names, base))
            else:
                blocks.append(ReplyBlock(prefix, names, {}, *rates))
        return blocks

    def update_norm(self, reply: Reply, request: Broadcast) -> float | None:
        """Norm of the update the server applies for this reply alone, for the bound
        ``--max-update-norm`` (None: the reply moves nothing): the largest move of its blocks
        (``reply_blocks``), ‖v_k − v‖ for iterates, ‖rate · g‖ for gradients."""
        norms = [block.norm(reply.tensors) for block in self.reply_blocks(reply, request)]
        return max(norms, default=None)

    def global_tensors(self, state: ServerState) -> Tensors:
        """The global model (w, a, b, α, buffers) held in a server state."""
        return state["model"]


@dataclass(frozen=True)
class ReplyBlock:
    """One block of a reply (its variables under one layout prefix) as the move it makes the
    model take: ``rate · (tensor − base)``. An iterate block has the broadcast model as its
    base (move v_k − v); a gradient block has none and the rates of the steps that apply it.
    DP clipping, the update-norm bound and centered clipping all measure a block by its move,
    so one bound means the same for every backend, whatever its replies carry."""

    prefix: str
    names: tuple[str, ...]
    base: Tensors
    primal_rate: float = 1.0
    dual_rate: float = 1.0

    def __post_init__(self) -> None:
        validate_positive("primal move rate", self.primal_rate)
        validate_positive("dual move rate", self.dual_rate)

    def rate(self, name: str) -> float:
        return self.dual_rate if name.endswith(DUAL) else self.primal_rate

    def move(self, tensors: Tensors) -> Tensors:
        """The block of ``tensors`` as a move (float64), over the names ``tensors`` holds."""
        out = {}
        for n in self.names:
            if n in tensors:
                value = tensors[n].double()
                if self.base:
                    value = value - self.base[n].double()
                out[n] = self.rate(n) * value
        return out

    def tensors_for(self, move: Tensors, like: Tensors) -> Tensors:
        """The block's tensors (dtype of ``like``) that make ``move``: the inverse of ``move``."""
        out = {}
        for n, m in move.items():
            value = m / self.rate(n) + (self.base[n].double() if self.base else 0.0)
            out[n] = value.to(like[n].dtype)
        return out

    def norm(self, tensors: Tensors) -> float | None:
        """‖move‖ (None if ``tensors`` holds none of the block)."""
        move = self.move(tensors)
        return math.sqrt(sum(float(m.pow(2).sum()) for m in move.values())) if move else None


def iterate_distance(model: Tensors, returned: Tensors, prefix: str = "") -> float | None:
    """‖v_k − v‖ over the model's variables (not buffers) that ``returned`` holds under
    ``prefix`` (None if it holds none)."""
    names = [n for n in model if not n.startswith(BUFFER) and prefix + n in returned]
    if not names:
        return None
    return math.sqrt(
        sum(float((returned[prefix + n].double() - model[n].double()).pow(2).sum()) for n in names)
    )


def model_part(tensors: Tensors) -> Tensors:
    """The global model inside a payload: w/, auc/ and buf/ tensors, without backend extras."""
    return {n: t for n, t in tensors.items() if n.startswith((WEIGHT, AUC, BUFFER))}

"""What a site masks: its reply as one vector of fixed-point numbers in Z_{2^64}, and the sums
the server gets back once the masks cancel.

The vector, in an order both sides derive from the broadcast (``vector_layout``): for every
tensor the backend aggregates (``Backend.secure_layout``), π_k · tensor (zeros where the site
did not train it); then per tensor π_k · 1{site sent it}; then π_k. π_k is the site's weight
(``Backend.site_weight``: 1, or its training examples) over a public unit (the largest weight
of the federation), so that the server learns Σ_k π_k x_k, per-tensor Σ π_k over the sites
that trained it (partial training) and Σ_k π_k — sums only, from which each backend takes
the weighted means it needs (``SecureSum``).

Encoding: x ↦ round(x · 2^32) mod 2^64, two's complement, so sums wrap as uint64 additions
and decode back as signed integers. Round-to-nearest, not Flower's ``quantize``: that clips
silently to a range, rounds stochastically with NumPy's global generator (a resumed run
would not reproduce) and keeps 2^22 levels. Error: each encoded value is off by at most
2^-33 (1.2e-10), so a sum of K values by at most K · 2^-33 and the mean over weights P by
at most K · 2^-33 · (1 + max|x|) / P, far below float32 resolution for K ≤ 10^3. A value
must satisfy |x| < 2^31 / n (n = participants) so that no sum overflows; a site refuses a
larger or non-finite value by name before anything is masked.

With ``--compress fp16`` the fixed point is the compression, in one step: 32-bit words with
20 fraction bits (``Words``), half the bytes of the 64-bit words and as many as an
uncompressed plain reply. A site then writes its update, π_k · (x_k − the broadcast it
received), stochastically rounded (unbiased; seeded by site, round and phase), and the
server adds the broadcast it holds exactly back to the mean (``SecureSum.decode``'s
``base``); a value must satisfy |x| < 2^11 / n, resolution 2^-20 (9.5e-7). The weights stay
round-to-nearest, so the sum's total weight is still checked exactly. ``int8`` has no such
encoding: 16-bit words would leave 8 fraction bits (3.9e-3), coarser than a typical update,
and a per-tensor scale would have to be public and taken from the sites' data.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fed_auc.algorithms.base import Backend, model_part
from fed_auc.exchange import Broadcast, Reply
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors

MASKED = "secagg/masked"  # the one tensor a masked reply carries (signed view of the words)


@dataclass(frozen=True)
class Words:
    """Fixed point with ``fraction`` bits in Z_{2^bits}: how a masked vector is written."""

    bits: int
    fraction: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(f"uint{self.bits}")

    @property
    def signed(self) -> np.dtype:
        return np.dtype(f"int{self.bits}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, f"int{self.bits}")

    @property
    def scale(self) -> float:
        return float(2**self.fraction)

    @property
    def limit(self) -> float:
        """|Σ| below this decodes unambiguously."""
        return 2.0 ** (self.bits - 1 - self.fraction)

    def to_field(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """round(x · 2^fraction) as two's complement words; stochastically with ``rng``."""
        scaled = np.asarray(values, dtype=np.float64) * self.scale
        rounded = np.rint(scaled) if rng is None else np.floor(scaled + rng.random(scaled.shape))
        return rounded.astype(np.int64).astype(self.signed).view(self.dtype)

    def from_field(self, words: np.ndarray) -> np.ndarray:
        """Inverse of ``to_field`` for a sum whose magnitude is below ``limit``."""
        return words.view(self.signed).astype(np.float64) / self.scale


WORDS = {"none": Words(64, 32), "fp16": Words(32, 20)}  # by --compress
PLAIN = WORDS["none"]


def words_for(compress: str) -> Words:
    """The words of ``--compress``'s masked vectors (``ValueError`` for int8, with why)."""
    if compress not in WORDS:
        raise ValueError(
            f"secure aggregation has no {compress} encoding: 16-bit words would leave 8 fraction "
            "bits (3.9e-3), coarser than a typical update; use compress fp16 (32-bit words)"
        )
    return WORDS[compress]


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def vector_layout(
    backend: Backend, broadcast: Broadcast, excluded: Collection[str] = ()
) -> list[Entry]:
    """The tensors of the masked vector, in order: for every prefix of
    ``Backend.secure_layout``, one per model variable, then the buffers if it has them
    (``excluded``: personal tensors, which never leave the sites)."""
    model = {n: t for n, t in model_part(broadcast.tensors).items() if n not in excluded}
    layout = backend.secure_layout(broadcast.phase)
    variables = [n for n in model if not n.startswith(BUFFER)]
    names = [prefix + n for prefix in layout.prefixes for n in variables]
    if layout.buffers:
        names += [n for n in model if n.startswith(BUFFER)]
    return [Entry(n, tuple(model[_base(n)].shape), model[_base(n)].dtype) for n in names]


def _base(name: str) -> str:
    """The model tensor a layout name refers to (``dc/w/x`` → ``w/x``)."""
    while not _is_model_name(name):
        name = name.split("/", 1)[1]
    return name


def vector_length(layout: Sequence[Entry]) -> int:
    """Values, then one weight per tensor, then the site's total weight."""
    return sum(e.size for e in layout) + len(layout) + 1


def encode_reply(
    reply: Reply,
    layout: Sequence[Entry],
    weight: float,
    participants: int,
    words: Words = PLAIN,
    base: Tensors | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """The site's vector of ``words`` (unsigned), before masking; raises ``ValueError`` naming
    the first tensor that is unexpected, misshapen, non-finite or too large to sum. ``base``:
    the broadcast as the site received it, whose tensors are sent as updates from it;
    ``rng``: stochastic rounding of the values (the weights are rounded to nearest)."""
    where = f"site {reply.site!r}, secure aggregation"
    names = {e.name for e in layout}
    unexpected = sorted(set(reply.tensors) - names)
    if unexpected:
        raise ValueError(f"{where}: tensor {unexpected[0]!r} is not in the aggregated layout")
    limit = words.limit / participants
    values, weights = [], []
    for entry in layout:
        tensor = reply.tensors.get(entry.name)
        if tensor is None:
            values.append(np.zeros(entry.size))
            weights.append(0.0)
            continue
        if tuple(tensor.shape) != entry.shape:
            raise ValueError(
                f"{where}: {entry.name!r} has shape {tuple(tensor.shape)}, expected {entry.shape}"
            )
        tensor = tensor.detach().double()
        origin = None if base is None else base.get(entry.name)
        if origin is not None and tuple(origin.shape) == entry.shape:
            tensor = tensor - origin.detach().double()
        flat = tensor.reshape(-1).numpy() * weight
        largest = float(np.max(np.abs(flat))) if flat.size else 0.0
        if not math.isfinite(largest) or largest >= limit:
            raise ValueError(
                f"{where}: {entry.name!r} holds {largest:.6g}; only finite values of magnitude "
                f"below {limit:.3g} (2^{words.bits - 1 - words.fraction} / {participants} "
                "sites) can be summed"
            )
        values.append(flat)
        weights.append(weight)
    counts = words.to_field(np.asarray([*weights, weight]))
    return np.concatenate([words.to_field(np.concatenate(values), rng), counts])


@dataclass(frozen=True)
class SecureSum:
    """What the server learns from a secure aggregation: sums over ``sites``, never a term.

    ``sums[name]`` = Σ_k π_k x_k; ``weights[name]`` = Σ π_k over the sites that sent the
    tensor; ``weight`` = Σ_k π_k; π_k = the site's weight / ``unit`` (all float64).
    """

    sums: Tensors
    weights: dict[str, float]
    weight: float
    unit: float
    sites: tuple[str, ...]
    dtypes: dict[str, torch.dtype]

    @classmethod
    def decode(
        cls,
        words: np.ndarray,
        layout: Sequence[Entry],
        unit: float,
        sites: Sequence[str],
        format: Words = PLAIN,
        base: Tensors | None = None,
    ) -> SecureSum:
        """The sums from the unmasked ``words``; ``base``: the model the sites' updates were
        taken from (``encode_reply``), added back with each tensor's total weight."""
        plain = format.from_field(words)
        sums, offset = {}, 0
        for entry in layout:
            sums[entry.name] = torch.from_numpy(plain[offset : offset + entry.size].copy())
            sums[entry.name] = sums[entry.name].view(entry.shape)
            offset += entry.size
        weights = {e.name: float(w) for e, w in zip(layout, plain[offset:-1], strict=True)}
        for name, origin in (base or {}).items():
            if name in sums and tuple(origin.shape) == tuple(sums[name].shape):
                sums[name] = sums[name] + origin.double() * weights[name]
        return cls(
            sums, weights, float(plain[-1]), unit, tuple(sites), {e.name: e.dtype for e in layout}
        )

    def mean(self, prefix: str = "", names: Collection[str] | None = None) -> Tensors:
        """Σ π_k x_k / Σ π_k per tensor under ``prefix`` (the prefix removed), over the sites
        that sent it: the partial-training weighted mean of ``weighted_mean``. Tensors no site
        sent are left out, so the model keeps them. ``names``: only these (unprefixed)."""
        out = {}
        for name, total in self.sums.items():
            inner = name[len(prefix) :]
            if not name.startswith(prefix) or not _is_model_name(inner):
                continue
            if names is not None and inner not in names:
                continue
            if self.weights[name] == 0.0:  # nobody sent it (an exact 0 once rounded)
                continue
            out[inner] = (total / self.weights[name]).to(self.dtypes[name])
        return out

    def total(self, name: str) -> torch.Tensor:
        """Σ_k w_k x_k in the backend's own weights w_k = π_k · unit (float64)."""
        return self.sums[name] * self.unit

    def total_weight(self, name: str | None = None) -> float:
        """Σ_k w_k over the sites that sent ``name`` (None: over all ``sites``)."""
        return (self.weight if name is None else self.weights[name]) * self.unit


def site_weights_for(
    backend: Backend, registrations: Mapping[str, Mapping[str, object]]
) -> tuple[dict[str, float], float]:
    """π_k of every registered site and the unit (the largest w_k), both public."""
    raw = {site: backend.site_weight(int(r["n"])) for site, r in registrations.items()}
    unit = max(raw.values())
    return {site: w / unit for site, w in raw.items()}, unit


def _is_model_name(name: str) -> bool:
    return name.startswith((WEIGHT, AUC, BUFFER))

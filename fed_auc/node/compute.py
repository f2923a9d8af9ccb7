"""Where a node computes and in what precision, and what its compute costs.

The node operator chooses (``--device``, ``[node] device``); a coordinator never sends a
device. ``auto`` takes CUDA when torch can use it, else the CPU; ``cuda`` or ``cuda:N`` that
torch cannot use is an error naming what was asked for and what was found, never a silent
CPU run. ``bf16``/``fp16`` run the network under ``torch.autocast``; parameters, the AUC
variables a, b, α, every gradient and everything that travels stay fp32 (fp16 gradients go
through a loss scale, ``LossScale``). ``Meter`` measures one local step: images per second,
the process's peak resident memory and, on CUDA, the peak device memory.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from fed_auc.exchange import COMPUTE_METRICS

AUTO = "auto"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_BACKOFFS = 64  # halvings of the fp16 loss scale before a batch's gradients count as bad
MIB = 2**20


def check_device(text: object, where: str = "device") -> str:
    """``text`` if it names a device fed-auc can use (auto, cpu, cuda, cuda:N); raise
    ``ValueError`` naming ``where`` otherwise. Says nothing about whether it is present."""
    ok = isinstance(text, str) and (
        text in (AUTO, "cpu", "cuda")
        or (text.startswith("cuda:") and text[5:].isdigit() and text[5:] == str(int(text[5:])))
    )
    if not ok:
        raise ValueError(f"{where} = {text!r}: must be auto, cpu, cuda or cuda:N (N = 0, 1, ...)")
    return text


def check_precision(text: object, where: str = "precision") -> str:
    if text not in PRECISIONS:
        raise ValueError(f"{where} = {text!r}: must be one of {list(PRECISIONS)}")
    return text


def cuda_found() -> str:
    """What this torch can see of CUDA, in words (for the error of a device it cannot use)."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU"
    count = torch.cuda.device_count()
    return f"{count} CUDA device(s): cuda:0 to cuda:{count - 1}"


def resolve_device(text: str, where: str = "device") -> torch.device:
    """The torch device for a device setting: ``auto`` = the first CUDA device if usable."""
    check_device(text, where)
    if text == AUTO:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    index = int(text[5:]) if ":" in text else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise ValueError(f"{where} = {text!r} asked for, but {cuda_found()}; {_cuda_remedy()}")
    return torch.device("cuda", index)


def _cuda_remedy() -> str:
    """What to do about a CUDA device this torch cannot use: a CPU-only build needs the CUDA
    build; a CUDA build that sees no GPU needs the GPU made visible (installing is no cure)."""
    if torch.version.cuda is None:
        return (
            "use --device cpu (or auto), or install a CUDA build of torch "
            '(hospitals/README.md, "A GPU node")'
        )
    if not torch.cuda.is_available():
        return (
            "this build can use a GPU, but none is visible to it: check `nvidia-smi` (driver), "
            "CUDA_VISIBLE_DEVICES and, in a container, its GPU access (`--gpus`); "
            "or use --device cpu (or auto)"
        )
    return "choose one of those devices, or auto"


class LossScale:
    """fp16's dynamic loss scale (``torch.amp.GradScaler``'s scale, growth and backoff) for
    gradients taken with ``torch.autograd.grad``, as the backends take them: a batch whose
    scaled gradients overflow is differentiated again at half the scale, so every local step
    applies finite, unscaled fp32 gradients (a backend never skips a step)."""

    def __init__(self, device: torch.device) -> None:
        self.scaler = torch.amp.GradScaler(device.type)
        self._good = 0  # steps since the scale last changed

    def gradients(self, value: torch.Tensor, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        for _ in range(MAX_BACKOFFS):
            scale = self.scaler.get_scale()
            scaled = self.scaler.scale(value)
            grads = torch.autograd.grad(scaled, inputs, retain_graph=True)
            if all(bool(torch.isfinite(g).all()) for g in grads):
                self._good += 1
                if self._good >= self.scaler.get_growth_interval():
                    self.scaler.update(scale * self.scaler.get_growth_factor())
                    self._good = 0
                return [g.float() / scale for g in grads]
            self.scaler.update(scale * self.scaler.get_backoff_factor())
            self._good = 0
        raise FloatingPointError(
            f"fp16: the gradients stayed non-finite after {MAX_BACKOFFS} halvings of the loss "
            "scale; train with --precision bf16 or fp32"
        )


@dataclass(frozen=True)
class Compute:
    """A node's device and precision, resolved once when the node is built."""

    device: torch.device
    precision: str = "fp32"

    @property
    def pins_memory(self) -> bool:
        """Whether images are read into pinned memory (faster copies to a CUDA device)."""
        return self.device.type == "cuda"

    @classmethod
    def of(cls, device: str = AUTO, precision: str = "fp32", where: str = "") -> Compute:
        """From the settings; ``where`` (e.g. a site file) prefixes every error."""
        prefix = f"{where}: " if where else ""
        return cls(
            resolve_device(device, f"{prefix}device"),
            check_precision(precision, f"{prefix}precision"),
        )

    def autocast(self) -> AbstractContextManager:
        """The network's reduced precision (none for fp32)."""
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def loss_scale(self) -> LossScale | None:
        return LossScale(self.device) if self.precision == "fp16" else None

    def move(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """A (nested) dict with every tensor on this device (other values as they are)."""
        return _map(tensors, lambda t: t.to(self.device, non_blocking=True))

    def batches(self, stream: Any) -> DeviceBatches:
        return DeviceBatches(stream, self.device)

    def describe(self) -> dict[str, str]:
        """What registration, the store and the model card say about it."""
        return {"device": str(self.device), "precision": self.precision}


def to_host(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """A (nested) dict with every tensor on the CPU: what is saved and what travels."""
    return _map(tensors, lambda t: t.cpu())


def _map(value: Any, move) -> Any:
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, Mapping):
        return {k: _map(v, move) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_map(v, move) for v in value)
    return value


class DeviceBatches:
    """A node's batch stream as a backend sees it, each batch on the device; everything else
    (its state, its sampling, DP-SGD's log) is the stream's own."""

    def __init__(self, stream: Any, device: torch.device) -> None:
        self._stream, self._device = stream, device
        self.images = 0  # drawn through this view (the meter's images per second)

    def __iter__(self) -> DeviceBatches:
        return self

    def __next__(self) -> Sequence[torch.Tensor]:
        batch = next(self._stream)
        self.images += len(batch[0])
        return type(batch)(*(t.to(self._device, non_blocking=True) for t in batch))

    def full_pass(self, batch_size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for chunk in self._stream.full_pass(batch_size):
            self.images += len(chunk[0])
            yield tuple(t.to(self._device, non_blocking=True) for t in chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def host_peak_mib() -> float:
    """This process's peak resident memory so far (MiB); ru_maxrss is KiB on Linux."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (MIB if sys.platform == "darwin" else 1024)


class Meter:
    """One local step's cost: ``with meter: ...`` then ``metrics(images)``, plain floats that
    travel in a reply's metrics (the device and precision are in the site's registration)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Meter:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self._start

    def metrics(self, images: int) -> dict[str, float]:
        rate, host, device = COMPUTE_METRICS
        out = {rate: images / self.seconds if self.seconds > 0 else 0.0, host: host_peak_mib()}
        if self.device.type == "cuda":
            out[device] = torch.cuda.max_memory_allocated(self.device) / MIB
        return {k: v for k, v in out.items() if math.isfinite(v)}


def compute_line(compute: Compute, metrics: Mapping[str, float]) -> str:
    """What a node prints of a round's compute after its round line: device, precision,
    images per second, peak memory."""
    parts = [f"{compute.device} {compute.precision}"]
    if "images_per_s" in metrics:
        parts.append(f"{metrics['images_per_s']:.1f} img/s")
    if "host_peak_mib" in metrics:
        parts.append(f"host peak {metrics['host_peak_mib']:.0f} MiB")
    if "device_peak_mib" in metrics:
        parts.append(f"device peak {metrics['device_peak_mib']:.0f} MiB")
    return " (" + ", ".join(parts) + ")"

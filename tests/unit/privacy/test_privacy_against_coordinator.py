"""DP against the coordinator: it cannot regenerate a site's noise and subtract it.

The test plays an honest-but-curious coordinator. It holds everything a coordinator holds
(the experiment config, its own broadcasts, each node's registration and reply, the store),
and more: it is even handed each release's exact key from the node's ledger. It then
regenerates the noise every way open to it (the key alone, as the noise was seeded before;
the key through HMAC with secrets it could guess) and checks its estimate against what the
node released. Every attack must fail: its estimate correlates with the noise no better than
chance. The same attack given the node's secret (read from its state directory) succeeds,
which shows that the test can fail.

Measured on the reply itself, no oracle of the noise needed:
- ``--dp update``: a reply's move is clip(move) + N(0, (σC)²): with the right noise the
  de-noised move has norm ≤ C; with a wrong estimate it keeps the noise's norm σC√d ≫ C.
- ``--dp example`` (one local step of local SGDA): the step is −η(S + σC·n)/m + λ-terms, so
  the move's correlation with the regenerated first noise draw n is near 1 with the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from pathlib import Path

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.data.base import Split
from fed_auc.data.poisson import PoissonBatches
from fed_auc.exchange import Broadcast, Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.setup import SEED_STRIDE
from fed_auc.privacy.accounting import LEDGER_FILE, SECRET_FILE, NodeSecret
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import WEIGHT, Trainable
from fed_auc.transport.local import LocalTransport
from tests.support.flower_like import FlowerLikeTransport, _over_worker, _site_files
from tests.support.flower_like import _png_csv as png_csv

SMALL = {
    "model": "tiny", "image_size": 16, "rounds": 1, "batch_size": 8, "select": "last",
    "algorithm": "local_sgda", "local_steps": 1, "seed": 3,
}  # fmt: skip
UPDATE_DP = {"dp_clip": 1.0, "dp_noise": 0.5}
EXAMPLE_DP = {"dp": "example", "dp_clip": 1.0, "dp_noise": 2.0}


# -- what the coordinator sees ------------------------------------------------------------
@pytest.fixture
def seen(monkeypatch) -> list[tuple[Broadcast, Reply]]:
    """Every (request, reply) pair a coordinator exchanges, over either transport."""
    exchanged: list[tuple[Broadcast, Reply]] = []
    for transport in (LocalTransport, FlowerLikeTransport):
        original = transport.train

        def train(self, requests, original=original):
            replies = original(self, requests)
            exchanged.extend(
                (requests[site], reply) for site, reply in replies.items()
                if isinstance(reply, Reply)
            )  # fmt: skip
            return replies

        monkeypatch.setattr(transport, "train", train)
    return exchanged


def _site_files_of(root: Path) -> list[Path]:
    sites = [(name, f"csv:{png_csv(root / name, ['label'], rows=36, seed=i)}")
             for i, name in enumerate(["west", "east"])]  # fmt: skip
    return _site_files(root / "sites", sites, {})


def _in_process(tmp_path: Path, options: dict) -> dict[str, Path]:
    """Run in-process; each site's node state directory (secret and ledger)."""
    runs = tmp_path / "sim"
    summary = run_simulation(ExperimentConfig(**SMALL, **options, runs_dir=str(runs)))
    nodes = runs / summary["run_id"] / "nodes"
    return {d.name: d for d in nodes.iterdir()}


def _over_flower_node_path(tmp_path: Path, options: dict) -> dict[str, Path]:
    """Run through the Flower coordinator and ``NodeWorker``s (as ``fed-auc node``) on site
    files; each site's node state directory."""
    files = _site_files_of(tmp_path)
    summary, _ = _over_worker({**SMALL, **options}, files, tmp_path / "flower")
    state = tmp_path / "sites" / "state"
    return {site: state / site / summary["run_id"] for site in ("west", "east")}


# -- the attacks --------------------------------------------------------------------------
def _key_of(state_dir: Path, round_: int) -> str:
    """The release's key, from the node's ledger: more than a coordinator knows."""
    ledger = json.loads((state_dir / LEDGER_FILE).read_text())
    keys = [k for k, r in ledger["releases"].items() if r["round"] == round_]
    assert len(keys) == 1
    return keys[0]


def _hmac_seed(secret: bytes, key: str) -> int:
    digest = hmac.new(secret, f"noise\0{key}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _seeds(key: str, site: str, seed: int) -> dict[str, int]:
    """Every seed the coordinator could try: what it can derive from what it holds."""
    return {
        "key alone (sha256, as update-level DP was seeded)": int.from_bytes(
            hashlib.sha256(key.encode()).digest()[:8], "little"
        ),
        "key alone (hex prefix, as DP-SGD was seeded)": int(key[:16], 16),
        "HMAC, secret = zeros": _hmac_seed(bytes(32), key),
        "HMAC, secret = the run's seed": _hmac_seed(str(seed).encode(), key),
        "HMAC, secret = the site's name": _hmac_seed(site.encode(), key),
    }


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a @ b) / (a.norm() * b.norm()))


def _chance(length: int) -> float:
    """|correlation| of independent vectors exceeds this with probability ~6e-7 (5 sd)."""
    return 5 / math.sqrt(length)


def _update_attack(broadcast: Broadcast, reply: Reply, seed: int, options: dict) -> dict:
    """Update-level DP: (correlation with the move, norm of the de-noised move) per seed."""
    backend = build_backend(SMALL["algorithm"], local_steps=SMALL["local_steps"])
    (block,) = backend.reply_blocks(reply, broadcast)
    move = block.move(reply.tensors)  # clip(move) + noise, in the order the node drew it
    observed = torch.cat([m.flatten() for m in move.values()])
    scale = options["dp_noise"] * options["dp_clip"]

    def estimate(generator: torch.Generator) -> torch.Tensor:
        return torch.cat([
            torch.randn(m.shape, generator=generator, dtype=reply.tensors[n].dtype).flatten()
            for n, m in move.items()
        ]).double() * scale  # fmt: skip

    return {"observed": observed, "estimate": estimate}


def _example_attack(broadcast: Broadcast, reply: Reply, seed: int, options: dict) -> dict:
    """DP-SGD, one local step: the weights' move against the first noise draw."""
    trainable = Trainable(
        build_model(SMALL["model"], norm="group"), build_loss("auc_margin", 1, [0.5])
    )
    order = list(trainable.primal)  # the node draws noise for (primal, then dual) in order
    weights = [n for n in order if n.startswith(WEIGHT)]
    observed = torch.cat([(broadcast.tensors[n] - reply.tensors[n]).flatten() for n in weights])

    def estimate(generator: torch.Generator) -> torch.Tensor:
        shapes = {n: trainable.primal[n].shape for n in order}
        draws = {n: torch.randn(shapes[n], generator=generator) for n in order}
        return torch.cat([draws[n].flatten() for n in weights])

    return {"observed": observed, "estimate": estimate}


def _attack(nodes: dict[str, Path], seen, options: dict, example: bool) -> None:
    assert len(seen) == len(nodes)  # one round, one phase: one reply per site
    for broadcast, reply in seen:
        state_dir = nodes[reply.site]
        key = _key_of(state_dir, broadcast.round)
        parts = (_example_attack if example else _update_attack)(
            broadcast, reply, SMALL["seed"], options
        )
        observed, estimate = parts["observed"], parts["estimate"]
        for name, seed in _seeds(key, reply.site, SMALL["seed"]).items():
            guess = estimate(torch.Generator().manual_seed(seed))
            r = _correlation(observed, guess)
            assert abs(r) < _chance(len(observed)), (reply.site, name, r)
            if not example:  # de-noising with the guess leaves more than the noise
                assert float((observed - guess).norm()) > 10 * options["dp_clip"], name
        # the same attack with the node's secret: the noise comes back
        secret = (state_dir / SECRET_FILE).read_bytes()
        right = estimate(torch.Generator().manual_seed(_hmac_seed(secret, key)))
        r = _correlation(observed, right)
        assert r > (0.999 if not example else 0.9), (reply.site, r)
        if not example:  # what is left is the clipped move: norm ≤ C
            assert float((observed - right).norm()) <= options["dp_clip"] * (1 + 1e-4)
            assert float(observed.norm()) > 10 * options["dp_clip"]  # the noise was real


@pytest.mark.parametrize(("mode", "options"), [("update", UPDATE_DP), ("example", EXAMPLE_DP)])
def test_the_coordinator_cannot_rebuild_a_sites_noise_in_process(tmp_path, seen, mode, options):
    nodes = _in_process(tmp_path, {**options, "sites": 2, "data_scale": 0.15})
    _attack(nodes, seen, options, example=mode == "example")


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "options"), [("update", UPDATE_DP), ("example", EXAMPLE_DP)])
def test_the_coordinator_cannot_rebuild_a_sites_noise_over_the_flower_node_path(
    tmp_path, seen, mode, options
):
    nodes = _over_flower_node_path(tmp_path, options)
    _attack(nodes, seen, options, example=mode == "example")


def test_the_secret_stays_on_the_node_and_the_sample_is_drawn_from_it(tmp_path, seen):
    """Nothing the coordinator receives or records holds the secret's bytes; DP-SGD's Poisson
    sample is seeded from it, not from the run's seed and the site's index."""
    nodes = _in_process(tmp_path, {**EXAMPLE_DP, "sites": 2, "data_scale": 0.15})
    runs = tmp_path / "sim"
    recorded = b"".join(p.read_bytes() for p in runs.rglob("*") if p.is_file()
                        and p.name not in (SECRET_FILE, LEDGER_FILE)
                        and "nodes" not in p.relative_to(runs).parts)  # fmt: skip
    for state_dir in nodes.values():
        secret = (state_dir / SECRET_FILE).read_bytes()
        assert len(secret) == 32 and secret not in recorded
        assert (state_dir / SECRET_FILE).stat().st_mode & 0o077 == 0  # the node's user only
        for _, reply in seen:
            assert all(secret not in t.numpy().tobytes() for t in reply.tensors.values())
    secrets = {(d / SECRET_FILE).read_bytes() for d in nodes.values()}
    assert len(secrets) == len(nodes)  # each node its own


def test_the_coordinator_cannot_predict_which_rows_dp_sgd_sampled(tmp_path):
    """Amplification by subsampling holds only while the sample is secret. The coordinator
    knows the run's seed, each site's size (registration) and how many steps it asked for: it
    replays the Poisson sampler from every seed a site's index could give (as the sampler was
    seeded before) and compares the generator state the node ended with. No replay matches;
    the node's own secret-seeded sampler does (the test can fail)."""
    nodes = _in_process(tmp_path, {**EXAMPLE_DP, "sites": 2, "data_scale": 0.15})
    with RunStore(tmp_path / "sim") as store:
        run_id = store.runs()["id"].iloc[0]
        sizes = store.site_rounds(run_id).query("round == 1").set_index("site")["n"]
    steps = SMALL["rounds"] * SMALL["local_steps"]
    for site, state_dir in nodes.items():
        saved = max(state_dir.glob("local_state*.pt"), key=lambda p: p.stat().st_mtime)
        ended = load_state(saved)["sampler"]["generator"]

        def replay(seed: int, n: int = int(sizes[site])) -> torch.Tensor:
            split = Split(torch.zeros(n, 1, 2, 2), (torch.arange(n) % 4 == 0).float()[:, None])
            sampler = PoissonBatches(split, SMALL["batch_size"], seed=seed)
            for _ in range(steps):
                next(sampler)
            return sampler.state_dict()["generator"]

        guesses = [SMALL["seed"] * SEED_STRIDE + index for index in range(len(nodes))]
        assert not any(torch.equal(replay(seed), ended) for seed in guesses), site
        secret = NodeSecret(state_dir)  # the node's own: what it really seeded
        assert torch.equal(replay(secret.seed("sampler")), ended), site

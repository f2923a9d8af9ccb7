"""A node's policy over Flower with real processes: two hospitals' `fed-auc node`s whose site
files carry a [policy], and coordinators that ask what the policy allows and what it does not.

One flow, one pair of nodes: a new experiment is refused until each site's operator runs
`fed-auc node approve`, then the resumed run trains; a backend outside the policy is refused, the
coordinator's console naming the site and the rule; a second run on the same images starts
from the first run's spend and is refused when it would pass the lifetime ε.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fed_auc.cli import main
from fed_auc.transport.flower.processes import free_port
from tests.support.data_files import write_npz
from tests.support.flower_files import _coordinator, _fed_auc, _summary
from tests.support.processes import stop_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SITES = ("north", "south")
POLICY = """
[policy]
backends = ["fedavg"]
dp_modes = ["example"]
lifetime_epsilon = 3.0
max_delta = 1e-5
"""
DP_RUN = {
    "algorithm": "fedavg", "rounds": 1, "local_steps": 2, "batch_size": 8, "model": "tiny",
    "warmup_rounds": 0, "dp": "example", "dp_clip": 1.0, "target_epsilon": 2.0,
}  # fmt: skip
REFUSED_BY = 25  # s the coordinator waits for sites that refuse


def _site(root: Path, name: str, seed: int) -> Path:
    (root / name).mkdir()
    write_npz(root / name / "site.npz", n=(40, 12, 16), seed=seed)
    path = root / f"{name}.toml"
    path.write_text(f'name = "{name}"\n\n[data]\nspec = "medmnist:{name}/site.npz"\n\n'
                    f'[node]\nstate_dir = "state/{name}"\n{POLICY}')  # fmt: skip
    return path


def _refused(root: Path, port: int, name: str, options: dict) -> str:
    """A coordinator whose sites all refuse: it fails after its register timeout; its log."""
    process = _coordinator(
        root, port, name, options, expected_sites=2, register_timeout_s=REFUSED_BY
    )
    assert process.wait(timeout=300) != 0
    return (root / f"{name}.log").read_text()


def test_approval_policy_refusals_and_the_lifetime_budget_over_flower(tmp_path):
    files = [_site(tmp_path, name, seed) for seed, name in enumerate(SITES)]
    port = free_port()
    nodes = {
        f.stem: _fed_auc(tmp_path, f"{f.stem}.log", "node", "--site", str(f), "--insecure",
                         "--coordinator", f"127.0.0.1:{port}")
        for f in files
    }  # fmt: skip
    try:
        # 1. a new experiment: the nodes register, then print it and its digest and refuse
        # to train it; the round fails, the run is saved. Approved, the resumed run trains.
        first = _coordinator(tmp_path, port, "first", DP_RUN, expected_sites=2)
        assert first.wait(timeout=300) != 0
        text = (tmp_path / "first.log").read_text()
        for site in SITES:
            assert f"site {site}: policy rule 'require_approval'" in text, text[-3000:]
            assert f"{site}: round 1 train" not in (tmp_path / f"{site}.log").read_text()
        for path in files:
            log = (tmp_path / f"{path.stem}.log").read_text()
            digest = re.search(rf"{path.stem}: new experiment ([0-9a-f]{{64}})", log).group(1)
            assert main(["node", "approve", "--site", str(path), digest]) == 0
        run_id = re.search(r"run (\S+): waiting for", text).group(1)
        resumed = _fed_auc(tmp_path, "resumed.log", "coordinator", "--resume", run_id,
                           "--runs-dir", "first", "--json")  # fmt: skip
        assert _summary(tmp_path, "resumed", resumed)["run_id"] == run_id
        for site in SITES:
            assert f"{site}: round 1 train" in (tmp_path / f"{site}.log").read_text()

        # 2. a backend outside the policy: the coordinator's console names site and rule
        text = _refused(tmp_path, port, "codasca", {**DP_RUN, "algorithm": "codasca"})
        for site in SITES:
            assert re.search(rf"refused\[policy\]: site {site}: policy rule 'backends'", text)

        # 3. the same experiment again on the same images: it starts from run 1's spend
        text = _refused(tmp_path, port, "second", DP_RUN)
        for site in SITES:
            assert re.search(
                rf"site {site}: policy rule 'lifetime_epsilon'.*this data has spent ε [0-9.]+ ",
                text,
            ), text[-3000:]
    finally:
        stop_all(nodes.values())
    for site in SITES:  # every refusal is in the node's own log, private to its user
        refusals = (tmp_path / "state" / site / "policy" / "refusals.log").read_text()
        for rule in ("require_approval", "backends", "lifetime_epsilon"):
            assert f'"rule": "{rule}"' in refusals

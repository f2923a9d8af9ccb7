"""External validation: train without some sites, then score the exported model at every site.

``TrainingSites`` is the transport as the training run sees it, the one way both transports
hold a site out: held-out sites are left out of the registrations (asked once, by the run
frame; so they count in no prevalence, threshold or round) and never sent a request; a
training request for one is refused before it leaves. After training, ``evaluate_export`` runs
the evaluation job (``fed_auc.evaluate.job``) of the exported model on every site through the
full transport; sites the model's card does not list are marked held out. ``leave_each_out``
runs one training per site plus the in-federation one and sets each site's held-out AUC beside
its in-federation AUC (``fed-auc simulate --leave-each-out``, and over Flower ``fed-auc
coordinator --leave-each-out``, which learns the sites from the first run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fed_auc.coordinator.errors import FederationError
from fed_auc.evaluate.job import model_request, record_and_write, run_job, trained_sites
from fed_auc.exchange import Registration, Transport
from fed_auc.store.run_store import RunStore

EVALUATION_DIR = "evaluation"


def check_hold_out(held_out: Sequence[str], sites: Sequence[str]) -> None:
    """Every held-out site must be a site of the federation, and one must be left to train."""
    unknown = sorted(set(held_out) - set(sites))
    if unknown:
        raise ValueError(
            f"hold_out: unknown site(s) {unknown}; the federation's sites: {list(sites)}"
        )
    if set(sites) <= set(held_out):
        raise ValueError(f"hold_out: {sorted(held_out)} leaves no site to train on")


class TrainingSites:
    """A transport without the held-out sites, registered once; anything else goes to the
    full transport. ``registrations``: every site's, as the run frame asked them (None: asked
    of the full transport on the first ``register``)."""

    def __init__(
        self,
        transport: Transport,
        held_out: Sequence[str],
        registrations: Mapping[str, Registration] | None = None,
    ) -> None:
        self.inner = transport
        self.held_out = frozenset(held_out)
        self.registrations = None if registrations is None else dict(registrations)

    def register(self) -> dict[str, Registration]:
        if self.registrations is None:
            self.registrations = self.inner.register()
        check_hold_out(sorted(self.held_out), list(self.registrations))
        return {s: r for s, r in self.registrations.items() if s not in self.held_out}

    @property
    def sites(self) -> list[str]:
        return [s for s in self.inner.sites if s not in self.held_out]

    def train(self, requests: Mapping[str, Any]) -> dict[str, Any]:
        self._refuse(requests)
        return self.inner.train(requests)

    def evaluate(self, sites: Sequence[str], *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._refuse(sites)
        return self.inner.evaluate(sites, *args, **kwargs)

    def use(self, setup: Any) -> TrainingSites:
        self.inner = self.inner.use(setup)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _refuse(self, sites: Sequence[str]) -> None:
        asked = sorted(self.held_out & set(sites))
        if asked:
            raise FederationError(f"held-out site(s) {asked} must not take part in training")


def evaluate_export(
    transport: Transport,
    runs_dir: str | Path,
    run_id: str,
    model_path: str | Path,
    transport_name: str,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Score the run's exported model at every site of ``transport`` (the held-out ones too),
    record it under the run and write it to ``<run>/evaluation``."""
    request, tensors, card = model_request(model_path, ["test"], bootstrap, seed)
    sites = transport.sites
    held_out = [s for s in sites if s not in trained_sites(card)]
    results = run_job(transport, sites, request, tensors, held_out)
    with RunStore(runs_dir) as store:
        out = Path(runs_dir) / run_id / EVALUATION_DIR
        summary = record_and_write(
            store, run_id, results, str(model_path), card, transport_name, out
        )
        store.add_event(run_id, f"exported model scored at every site; held out: {held_out}")
    return summary


def leave_each_out(
    sites: Sequence[str] | None,
    train: Callable[[list[str]], dict[str, Any]],
    inside: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``train(held_out)`` runs one federation (its summary has ``evaluation``); one run with
    nothing held out, then one per site. Per site and label: held-out and in-federation AUC.
    ``sites`` None: the sites the run with nothing held out trained (its summary's
    ``sites``: over Flower they are known once the nodes register), in its order. Each row
    names the positive class of the AUCs (the run with every site's)."""
    if inside is None:
        inside = train([])
    if sites is None:
        sites = inside["sites"]
    rows = []
    for site in sites:
        outside = train([site])
        held = outside["evaluation"]["auc"]["test"].get(site)
        within = inside["evaluation"]["auc"]["test"].get(site)
        rows.append(
            {
                "site": site,
                "held_out_auc": held,
                "in_federation_auc": within,
                "held_out_run": outside["run_id"],
                "in_federation_run": inside["run_id"],
                "positive_class": inside.get("positive_class"),
            }
        )
    return rows

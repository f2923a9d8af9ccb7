"""The SQLite run store (``RunStore``): the run tables (``schema``), what a round writes
(``records``), the evaluation tables (``evaluations``), two runs' paired comparisons
(``comparisons``) and prediction jobs (``predictions``). The dashboard reads only this."""

from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import SCHEMA, STORE_FILE, RunStore, StoreError

__all__ = ["SCHEMA", "STORE_FILE", "RoundRecord", "RunStore", "SiteRound", "StoreError"]

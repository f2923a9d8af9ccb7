"""The run tables of the store: runs, their rounds, each site's row per round, the sites'
data summaries and events; and the columns added since they first shipped."""

from __future__ import annotations

RUN_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    algorithm TEXT NOT NULL,
    status TEXT NOT NULL,             -- running / completed / failed
    config TEXT NOT NULL,             -- JSON: everything needed to reproduce the run
    started_at REAL NOT NULL,
    ended_at REAL,
    git_rev TEXT,
    run_dir TEXT,
    summary TEXT                      -- JSON, written when the run ends
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(id),
    round INTEGER NOT NULL,           -- 0 = the initial model, before any training
    stage INTEGER,
    lr REAL,
    global_auc REAL,                  -- pooled test AUC of the global model over all sites
    global_val_auc REAL,
    worst_site_auc REAL,
    mean_site_auc REAL,
    metrics TEXT,                     -- JSON: per-label AUCs and anything else
    duration_s REAL,
    bytes_down INTEGER,
    bytes_up INTEGER,
    finished_at REAL,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE IF NOT EXISTS site_rounds (
    run_id TEXT NOT NULL REFERENCES runs(id),
    round INTEGER NOT NULL,
    site TEXT NOT NULL,
    status TEXT NOT NULL,             -- selected / completed / dropped / rejected / error / idle
    steps INTEGER,
    trained_groups TEXT,              -- JSON list of layer-group names
    n INTEGER,                        -- training examples
    positives TEXT,                   -- JSON list, per label
    auc REAL,                         -- test AUC of the global model at this site
    auc_lo REAL,
    auc_hi REAL,
    val_auc REAL,
    n_test INTEGER,
    test_positives TEXT,              -- JSON list, per label
    personal_auc REAL,
    personal_auc_lo REAL,
    personal_auc_hi REAL,
    update_norm REAL,                 -- ‖Δw_k‖
    drift REAL,                       -- ‖Δw_k − mean Δw‖
    cosine REAL,                      -- cos(Δw_k, mean Δw)
    cv_drift REAL,                    -- ‖Δc_k‖ (control-variate change), where the backend has one
    train_loss REAL,
    duration_s REAL,
    bytes_down INTEGER,
    bytes_up INTEGER,
    metrics TEXT,                     -- JSON
    dp_epsilon REAL,                  -- DP-SGD: the site's ε spent so far (its accountant)
    dp_delta REAL,                    -- ... at this δ
    dp_relation TEXT,                 -- ... for this neighbouring relation (accounting.RELATIONS)
    PRIMARY KEY (run_id, round, site)
);
CREATE TABLE IF NOT EXISTS sites (
    run_id TEXT NOT NULL REFERENCES runs(id),
    site TEXT NOT NULL,
    summary TEXT NOT NULL,            -- JSON data-card summary: counts, prevalence, intensity
    PRIMARY KEY (run_id, site)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    run_id TEXT NOT NULL,
    round INTEGER,
    site TEXT,
    level TEXT NOT NULL,              -- info / warning / error
    message TEXT NOT NULL
);
"""

# Columns added since a table was first shipped: an older store gets them when opened, so it
# stays readable and writable (rows written before read NULL there).
ADDED_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "site_rounds": [("dp_epsilon", "REAL"), ("dp_delta", "REAL"), ("dp_relation", "TEXT")],
}

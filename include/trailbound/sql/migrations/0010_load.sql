-- Initial loads (`trailbound load`, docs/initial-load.md): one row per load, per table it
-- copies, and per key-range chunk. A chunk's row says `done` once its rows are where the
-- load puts them (the target, at a snapshot; the target's staging table and a high
-- watermark in the source, between watermarks), so a load killed anywhere is resumed
-- from its first chunk not done, and `info replicat` shows a load in progress.
CREATE TABLE trailbound.load_run (
    load_id        bigserial   PRIMARY KEY,
    source         text        NOT NULL,
    replicat       text        NOT NULL,
    mode           text        NOT NULL CHECK (mode IN ('snapshot', 'watermark')),
    table_pattern  text        NOT NULL,
    chunk_rows     integer     NOT NULL,
    state          text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'abandoned')),
    snapshot_lsn   text,                   -- snapshot: the slot's consistent point (X/Y)
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz
);

CREATE INDEX load_run_replicat ON trailbound.load_run (replicat, state);

CREATE TABLE trailbound.load_table (
    load_id         bigint  NOT NULL REFERENCES trailbound.load_run ON DELETE CASCADE,
    source_table    text    NOT NULL,      -- schema.name at the source
    target_table    text    NOT NULL,      -- schema.name in the target (the replicat's MAP)
    key_columns     text[]  NOT NULL,
    estimated_rows  bigint  NOT NULL,      -- the source planner's estimate when planned
    PRIMARY KEY (load_id, source_table)
);

CREATE TABLE trailbound.load_chunk (
    load_id       bigint      NOT NULL,
    source_table  text        NOT NULL,
    chunk_no      integer     NOT NULL,
    lo            jsonb,                   -- key column -> text form; null: open
    hi            jsonb,
    state         text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    rows_copied   bigint,
    window_id     text,                    -- watermark: the window whose high watermark carries it
    done_at       timestamptz,
    PRIMARY KEY (load_id, source_table, chunk_no),
    FOREIGN KEY (load_id, source_table) REFERENCES trailbound.load_table ON DELETE CASCADE
);

-- Compare runs (`trailbound compare SRC REP1`, docs/compare.md): per run, per table the
-- figures a DBA reads, and each row found out of sync (or still in flight) with its key.
-- A later compare reads the previous run's in-flight rows: one whose source image has
-- not changed since is confirmed as soon as the replicat is past where it was read.

CREATE TABLE trailbound.compare_run (
    run_id             bigserial   PRIMARY KEY,
    source             text        NOT NULL,
    replicat           text        NOT NULL,
    table_pattern      text        NOT NULL,
    started_at         timestamptz NOT NULL,
    ended_at           timestamptz NOT NULL DEFAULT now(),
    applied_through    bigint      NOT NULL,   -- source position (LSN as an integer) the replicat had applied through
    rounds             integer     NOT NULL,   -- confirm rounds
    rows_compared      bigint      NOT NULL,
    out_of_sync        bigint      NOT NULL,
    in_flight          bigint      NOT NULL,
    note               text,                   -- why rows stayed in flight
    report_file        text        NOT NULL    -- the JSON report; the text one beside it (.txt)
);

CREATE INDEX compare_run_replicat ON trailbound.compare_run (replicat, run_id);

CREATE TABLE trailbound.compare_table (
    run_id            bigint  NOT NULL REFERENCES trailbound.compare_run ON DELETE CASCADE,
    source_table      text    NOT NULL,
    target_table      text    NOT NULL,
    ranges            integer NOT NULL,       -- key ranges compared (one Spark task each)
    ranges_differing  integer NOT NULL,       -- ranges whose digests differed: their rows were read
    rows_compared     bigint  NOT NULL,
    in_sync           bigint  NOT NULL,
    missing           bigint  NOT NULL,       -- in the source, not in the target
    extra             bigint  NOT NULL,       -- in the target, not in the source
    different         bigint  NOT NULL,       -- same key, some column differs
    in_flight         bigint  NOT NULL,       -- different, not confirmed (the replicat was not past them)
    PRIMARY KEY (run_id, source_table)
);

CREATE TABLE trailbound.compare_row (
    run_id        bigint  NOT NULL,
    source_table  text    NOT NULL,
    kind          text    NOT NULL CHECK (kind IN ('missing', 'extra', 'different', 'in_flight')),
    key           jsonb   NOT NULL,           -- the key columns' text forms (keyless table: the whole row)
    columns       text[],                     -- different: the columns that differ
    source_image  jsonb,                      -- column texts (keyless: how many such rows); null: no row
    target_image  jsonb,
    read_at       bigint  NOT NULL,           -- source position just after the source image was read
    FOREIGN KEY (run_id, source_table) REFERENCES trailbound.compare_table ON DELETE CASCADE
);

CREATE INDEX compare_row_run ON trailbound.compare_row (run_id, source_table);

-- Pump groups (trail shipping) and trail purge.
--
-- A pump reads the committed files of one trail and writes them to a remote trail with
-- its own prefix and seqnos. Each shipped file commits in one metadata transaction: the
-- pump's read and write checkpoints, the remote file's trail_file row, the pump's
-- trail_reader position on the source trail and its run-history row.

CREATE TABLE trailbound.pump_group (
    group_name    text        PRIMARY KEY,
    exttrail      text        NOT NULL,   -- the trail it reads (trail_file.trail of the source)
    rmttrail      text        NOT NULL,   -- the trail it writes (absolute path or URI)
    table_spec    text,                   -- TABLE filter patterns, comma separated; null: PASSTHRU
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_started  timestamptz,
    last_run_end  timestamptz
);

-- One writer per remote trail: two pumps writing the same seqnos would overwrite each other.
CREATE UNIQUE INDEX pump_group_rmttrail ON trailbound.pump_group (rmttrail);

-- Read: the source position reached (files below read_seqno fully shipped, read_rba records
-- of file read_seqno). It always equals the pump's trail_reader row. Write: the last remote
-- file committed (0: none yet), its records, and the last CSN it holds.
CREATE TABLE trailbound.pump_checkpoint (
    group_name    text        PRIMARY KEY REFERENCES trailbound.pump_group ON DELETE CASCADE,
    read_seqno    bigint      NOT NULL DEFAULT 0,
    read_rba      bigint      NOT NULL DEFAULT 0,
    write_seqno   bigint      NOT NULL DEFAULT 0,
    write_rba     bigint      NOT NULL DEFAULT 0,
    last_csn      text,                   -- Csn text form scn@thread:sequence:rba
    last_csn_scn  bigint,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Which remote file each source file became (null: every record was filtered out).
CREATE TABLE trailbound.pump_file (
    group_name      text        NOT NULL REFERENCES trailbound.pump_group ON DELETE CASCADE,
    source_seqno    bigint      NOT NULL,
    source_records  bigint      NOT NULL,
    remote_seqno    bigint,
    remote_records  bigint      NOT NULL,
    shipped_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, source_seqno)
);

-- One row per run that committed at least one file; updated with every file it commits,
-- so a run that died part-way still shows what it shipped.
CREATE TABLE trailbound.pump_run (
    run_id           bigserial   PRIMARY KEY,
    group_name       text        NOT NULL REFERENCES trailbound.pump_group ON DELETE CASCADE,
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz NOT NULL DEFAULT now(),
    files_read       bigint      NOT NULL,
    files_written    bigint      NOT NULL,
    records_read     bigint      NOT NULL,
    records_written  bigint      NOT NULL,
    checkpoints      jsonb       NOT NULL
);

-- Trail purge keeps the row of a deleted file (history, and the committed end of the trail
-- for writers that number on from it) and marks it.
ALTER TABLE trailbound.trail_file ADD COLUMN purged_at timestamptz;

-- Every trail file purge deleted, and why: the readers' positions at the time.
CREATE TABLE trailbound.trail_purge (
    purge_id   bigserial   PRIMARY KEY,
    trail      text        NOT NULL,
    seqno      bigint      NOT NULL,
    path       text        NOT NULL,
    records    bigint      NOT NULL,
    purged_at  timestamptz NOT NULL DEFAULT now(),
    reason     text        NOT NULL,
    readers    jsonb       NOT NULL       -- [{"kind", "group", "seqno", "rba"}] at deletion
);

CREATE INDEX trail_purge_trail ON trailbound.trail_purge (trail, seqno);

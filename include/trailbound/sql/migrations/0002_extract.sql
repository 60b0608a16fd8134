-- Capture (Extract) groups and their checkpoints. A capture run commits all of these in
-- one metadata transaction: that commit is the run's commit point.

CREATE TABLE trailbound.extract_group (
    group_name     text        PRIMARY KEY,
    source         text        NOT NULL,
    exttrail       text        NOT NULL,            -- trail prefix (absolute path)
    begin_scn      bigint      NOT NULL,            -- transactions starting below it are not captured
    begin_spec     text        NOT NULL,            -- what the user asked for: earliest, now, a time, scn N
    table_spec     text        NOT NULL,            -- the TABLE selection the checkpoints were made with
    read_scn       bigint,                          -- everything below this SCN has been read (null: never run)
    created_at     timestamptz NOT NULL DEFAULT now(),
    altered_at     timestamptz,
    last_started   timestamptz,
    last_run_end   timestamptz
);

-- Per thread: startup (where the group started reading), recovery (start of the oldest
-- open transaction, or the current position) and current (last record read).
CREATE TABLE trailbound.extract_read_checkpoint (
    group_name  text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    thread      integer     NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('startup', 'recovery', 'current')),
    sequence    bigint      NOT NULL,
    rba         bigint      NOT NULL,
    scn         bigint      NOT NULL,
    ts          timestamptz,
    segment     text,
    PRIMARY KEY (group_name, thread, kind)
);

-- The write checkpoint: the trail position reached and the last CSN written.
CREATE TABLE trailbound.extract_write_checkpoint (
    group_name    text        PRIMARY KEY REFERENCES trailbound.extract_group ON DELETE CASCADE,
    seqno         bigint      NOT NULL,
    rba           bigint      NOT NULL,
    last_csn      text,                   -- Csn text form scn@thread:sequence:rba
    last_csn_scn  bigint,
    written_at    timestamptz NOT NULL DEFAULT now()
);

-- Trail files whose content a committed write checkpoint covers. Readers see only these.
CREATE TABLE trailbound.trail_file (
    trail       text        NOT NULL,     -- the trail prefix (absolute path)
    seqno       bigint      NOT NULL,
    path        text        NOT NULL,
    records     bigint      NOT NULL,
    bytes       bigint      NOT NULL,
    sha256      text        NOT NULL,
    first_csn   text        NOT NULL,
    last_csn    text        NOT NULL,
    log_bsn     bigint      NOT NULL,     -- recovery SCN of the run that wrote it
    written_by  text        NOT NULL,     -- group name
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trail, seqno)
);

-- Transactions open at the end of the last run.
CREATE TABLE trailbound.open_transaction (
    group_name      text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    xid             text        NOT NULL,
    thread          integer     NOT NULL,
    start_sequence  bigint      NOT NULL,
    start_rba       bigint      NOT NULL,
    start_scn       bigint      NOT NULL,
    start_ts        timestamptz NOT NULL,
    records         bigint      NOT NULL,
    bytes           bigint      NOT NULL,
    skip_reason     text,                 -- not null: never written (in flight at begin, skiptrans)
    PRIMARY KEY (group_name, thread, xid)
);

-- One row per committed run: what it read and wrote, and its checkpoints (for SHOWCH N).
CREATE TABLE trailbound.extract_run (
    run_id            bigserial   PRIMARY KEY,
    group_name        text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    started_at        timestamptz NOT NULL,
    ended_at          timestamptz NOT NULL DEFAULT now(),
    until_time        timestamptz,
    read_from_scn     bigint,
    horizon_scn       bigint,
    records_read      bigint      NOT NULL,
    transactions      bigint      NOT NULL,
    records_written   bigint      NOT NULL,
    checkpoints       jsonb       NOT NULL
);

-- Bounded Recovery, long-running transactions and directives to capture.

-- The log time the last run read up to (the horizon's time): BR intervals and
-- transaction ages are measured in log time, so backfills behave like live runs.
ALTER TABLE trailbound.extract_group
    ADD COLUMN read_time        timestamptz,
    ADD COLUMN br_suspended     text,        -- not null: BR off after a failure (BROFFONFAILURE), why
    ADD COLUMN last_longtrans_check timestamptz;

-- A persisted open transaction: its records up to persisted_through are in
-- persisted_file (under BRDIR/<group>/, named by a hash of the xid).
ALTER TABLE trailbound.open_transaction
    ADD COLUMN persisted_file      text,
    ADD COLUMN persisted_sha256    text,
    ADD COLUMN persisted_records   bigint,
    ADD COLUMN persisted_through_sequence bigint,
    ADD COLUMN persisted_through_rba      bigint,
    ADD COLUMN persisted_checkpoint bigint;

-- One row per BR checkpoint. The newest one of a group is the one recovery uses.
CREATE TABLE trailbound.br_checkpoint (
    checkpoint_id       bigserial   PRIMARY KEY,
    group_name          text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    scn                 bigint      NOT NULL,   -- its own position: every record below was read
    log_time            timestamptz NOT NULL,
    interval_seconds    integer     NOT NULL,
    table_spec          text        NOT NULL,   -- the TABLE selection it was made with
    oldest_nonpersisted jsonb       NOT NULL,   -- per thread: the oldest open, not persisted transaction
    persisted           integer     NOT NULL,
    persisted_bytes     bigint      NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX br_checkpoint_group ON trailbound.br_checkpoint (group_name, checkpoint_id);

-- What each run re-read, to show (and test) the bound Bounded Recovery guarantees.
ALTER TABLE trailbound.extract_run
    ADD COLUMN recovery         text,          -- normal | bounded | normal (fallback: ...)
    ADD COLUMN reread_records   bigint,
    ADD COLUMN read_from_time   timestamptz,
    ADD COLUMN read_time        timestamptz,
    ADD COLUMN br_checkpoint_id bigint;

-- Warnings a run records: long-running transactions (WARNLONGTRANS), BR fallbacks.
CREATE TABLE trailbound.extract_warning (
    warning_id  bigserial   PRIMARY KEY,
    group_name  text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    kind        text        NOT NULL CHECK (kind IN ('longtrans', 'br_fallback')),
    xid         text,
    thread      integer,
    detail      jsonb       NOT NULL,
    log_time    timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- SEND EXTRACT directives, applied by the next run and then marked done.
CREATE TABLE trailbound.extract_directive (
    directive_id bigserial   PRIMARY KEY,
    group_name   text        NOT NULL REFERENCES trailbound.extract_group ON DELETE CASCADE,
    kind         text        NOT NULL CHECK (kind IN ('skiptrans', 'forcetrans', 'brreset')),
    xid          text,
    thread       integer,
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    result       text,
    requested_at timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz
);

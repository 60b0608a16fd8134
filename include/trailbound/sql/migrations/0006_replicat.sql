-- Replicat groups: the metadata store's side of their checkpoints.
--
-- The checkpoint table in the target database (add checkpointtable) is authoritative: it
-- is updated in the same target transaction as the data it covers. The file checkpoint
-- here is committed just after each target commit (with the group's trail_reader row);
-- when the two disagree, a run starts from the checkpoint table's row and repairs these
-- rows from it. See docs/replicat.md.

CREATE TABLE trailbound.replicat_group (
    group_name        text        PRIMARY KEY,
    exttrail          text        NOT NULL,   -- the trail it reads (trail_file.trail)
    checkpoint_table  text        NOT NULL,   -- schema.name of its checkpoint table in the target
    created_at        timestamptz NOT NULL DEFAULT now(),
    altered_at        timestamptz,
    last_started      timestamptz,
    last_run_end      timestamptz
);

-- The file checkpoint: the next record to read (seqno 0: the start of the trail) and the
-- last transaction applied. Every transaction with a CSN at or below log_csn is applied
-- (after `alter replicat ... atcsn|aftercsn` it is the bound the user set).
CREATE TABLE trailbound.replicat_checkpoint (
    group_name     text        PRIMARY KEY REFERENCES trailbound.replicat_group ON DELETE CASCADE,
    seqno          bigint      NOT NULL DEFAULT 0,
    rba            bigint      NOT NULL DEFAULT 0,
    log_csn        text,                  -- Csn text form scn@thread:sequence:rba
    log_csn_scn    bigint,
    log_bsn        bigint,                -- recovery SCN of the capture that wrote that transaction
    audit_ts       timestamptz,           -- its commit time at the source
    startup_seqno  bigint,                -- where the last run started reading
    startup_rba    bigint,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- One row per run that got as far as reading the trail (SHOWCH history, and the numbers
-- a user looks at: what was applied, skipped, replayed).
CREATE TABLE trailbound.replicat_run (
    run_id           bigserial   PRIMARY KEY,
    group_name       text        NOT NULL REFERENCES trailbound.replicat_group ON DELETE CASCADE,
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz NOT NULL DEFAULT now(),
    started_from     text        NOT NULL,   -- 'checkpoint table' or 'file checkpoint'
    start_seqno      bigint      NOT NULL,
    start_rba        bigint      NOT NULL,
    end_seqno        bigint      NOT NULL,
    end_rba          bigint      NOT NULL,
    log_csn          text,
    groups           bigint      NOT NULL,   -- target transactions committed
    transactions     bigint      NOT NULL,   -- source transactions applied
    operations       bigint      NOT NULL,   -- their row changes
    skipped          bigint      NOT NULL,   -- source transactions at or below log_csn
    replayed_groups  bigint      NOT NULL,   -- groups applied transaction by transaction
    collisions       bigint      NOT NULL,   -- HANDLECOLLISIONS
    timings          jsonb       NOT NULL
);

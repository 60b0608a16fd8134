-- Archive-log retention (docs/retention.md): capture registrations, the purge record in
-- the archive catalog, and a log of retention runs.

-- REGISTER EXTRACT ... LOGRETENTION: one row per capture group (the analogue of a
-- DBA_CAPTURE row). A capture run updates required_scn in the same metadata transaction
-- as its checkpoints. Not a foreign key to extract_group: a group may be registered
-- before its first run, and deleting a group must not silently release the log it holds
-- (as in Oracle, where an orphaned capture keeps its logs until it is unregistered).
CREATE TABLE trailbound.capture_registration (
    group_name     text        PRIMARY KEY,
    source         text        NOT NULL,
    first_scn      bigint      NOT NULL,   -- the lowest SCN the group could ever ask for, at registration
    required_scn   bigint      NOT NULL,   -- the lowest SCN its next run can need (BR-aware)
    enabled        boolean     NOT NULL DEFAULT true,   -- false after UNREGISTER: holds nothing
    registered_at  timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    needs_restore  text                    -- not null: segments it needs were purged by the space limit
);

-- One row per retention run that was not a dry run.
CREATE TABLE trailbound.retention_run (
    run_id           bigserial   PRIMARY KEY,
    source           text        NOT NULL,
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz NOT NULL DEFAULT now(),
    required_scn     bigint,                 -- minimum over enabled registrations (null: none)
    registrations    jsonb       NOT NULL,   -- [{"group", "required_scn", "committed_scn", "read_scn"}]
    policy           jsonb       NOT NULL,   -- minkeephours, backedup, maxbytes in force
    purged_segments  integer     NOT NULL,
    purged_bytes     bigint      NOT NULL,
    forced_segments  integer     NOT NULL,   -- purged by the space limit
    warning          text                    -- the space-limit warning, when needed segments went
);

-- Why and on what authority a segment was purged; how many backups cover it; when its
-- files were restored after a purge (the scan makes it available again).
ALTER TABLE trailbound.archive_segment
    ADD COLUMN purge_reason     text,
    ADD COLUMN purge_scn        bigint,      -- the required SCN that allowed it (null: forced by the space limit)
    ADD COLUMN purge_run_id     bigint REFERENCES trailbound.retention_run,
    ADD COLUMN backed_up_count  integer     NOT NULL DEFAULT 0 CHECK (backed_up_count >= 0),
    ADD COLUMN restored_at      timestamptz;

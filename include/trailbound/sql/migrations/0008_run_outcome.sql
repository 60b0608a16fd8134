-- Every run's outcome (INFO ALL's ABENDED): one row per `extract|pump|replicat run`,
-- written when the run starts and completed when it ends, whatever the outcome. The
-- stage history tables (extract_run, pump_run, replicat_run) hold only runs that
-- committed something, so a run that failed before (or instead of) committing would
-- leave no trace there.
--
-- Not a foreign key to the group tables: a first run can fail before its group exists,
-- and the outcome of a run must survive whatever the run did to its group.
CREATE TABLE trailbound.run_outcome (
    run_id      bigserial   PRIMARY KEY,
    kind        text        NOT NULL CHECK (kind IN ('extract', 'pump', 'replicat')),
    group_name  text        NOT NULL,
    command     text        NOT NULL,               -- the command line (it carries no secret)
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,                        -- null: running, or died without a word (killed)
    outcome     text        NOT NULL DEFAULT 'running'
                CHECK (outcome IN ('running', 'ok', 'error', 'refused')),
    error       text                                -- what the run said when it failed (passwords redacted)
);

CREATE INDEX run_outcome_group ON trailbound.run_outcome (kind, group_name, run_id);

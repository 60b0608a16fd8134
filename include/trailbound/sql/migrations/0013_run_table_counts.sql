-- STATS EXTRACT|PUMP|REPLICAT: per run, per table, the operations each stage committed
-- (trailbound.runcounts writes them, trailbound.stats reads them). Each row is written in
-- the metadata transaction that commits the run's checkpoint (a pump's: each file's),
-- so the counts never say more or less than the checkpoint covers.
--
-- run_id is the stage's own run (extract_run, pump_run, replicat_run), not a foreign
-- key: deleting a group keeps its statistics, as run_outcome keeps its outcomes.
-- table_name is the source table as the trail names it; target_table the replicat's
-- MAP target (null for extract and pump, and for a table replicat does not map).
-- discards stay 0 until REPERROR ... DISCARD exists; collisions are replicat's
-- HANDLECOLLISIONS (counted where it applies a record one statement at a time).
CREATE TABLE trailbound.run_table_counts (
    stage           text        NOT NULL CHECK (stage IN ('extract', 'pump', 'replicat')),
    group_name      text        NOT NULL,
    run_id          bigint      NOT NULL,
    table_name      text        NOT NULL,
    target_table    text,
    run_started_at  timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),  -- the commit of the counts (a pump's last file)
    inserts         bigint      NOT NULL DEFAULT 0,
    updates         bigint      NOT NULL DEFAULT 0,
    deletes         bigint      NOT NULL DEFAULT 0,
    truncates       bigint      NOT NULL DEFAULT 0,
    discards        bigint      NOT NULL DEFAULT 0,
    collisions      bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (stage, group_name, run_id, table_name)
);

CREATE INDEX run_table_counts_recorded ON trailbound.run_table_counts (stage, group_name, recorded_at);

-- Parallel apply (replicat's apply_parallelism, docs/replicat.md): how many of a run's
-- target transactions were applied on a parallel session, for `info replicat --showch`.
ALTER TABLE trailbound.replicat_run ADD COLUMN parallel_groups bigint NOT NULL DEFAULT 0;

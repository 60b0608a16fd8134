-- What each capture run's time went to and how its records became the trail, beside what
-- it committed (VIEW REPORT prints both, as it prints replicat's phases): the phases the
-- run timed up to its commit (seconds by phase, capture.run's Stopwatch) and its assembly
-- ("in commit order (one pass)", "in commit order (one task)", "grouped by transaction:
-- <why>"). Runs recorded before this migration have neither.
ALTER TABLE trailbound.extract_run ADD COLUMN timings jsonb;
ALTER TABLE trailbound.extract_run ADD COLUMN assembly text;

-- The heartbeat (docs/heartbeat.md): the metadata store's copy of the heartbeats each
-- replicat applied, for `lag`, INFO ALL, the metrics and the console. The target holds
-- the same tables and view in its checkpoint table's schema, written in the target
-- transaction that applies each heartbeat (replicat/heartbeat.py); this copy is written
-- with the file checkpoint that follows it. Keep the two in step (heartbeat.py's
-- statements write both).
--
-- Stamps: written_at the source wrote the row (its clock), archived_at the archive's
-- writer took it, captured_at capture committed the trail file holding it, pumped_at the
-- pump committed the remote file (null: no pump), applied_at replicat wrote it in the
-- target transaction applying it.
CREATE TABLE trailbound.heartbeat (
    group_name   text        NOT NULL,   -- the replicat
    source       text        NOT NULL,   -- the heartbeat row's key: the source that wrote it
    seq          bigint      NOT NULL,
    written_at   timestamptz NOT NULL,
    archived_at  timestamptz,
    captured_at  timestamptz,
    pumped_at    timestamptz,
    applied_at   timestamptz,
    csn          text        NOT NULL,   -- the heartbeat transaction's CSN
    PRIMARY KEY (group_name, source)
);

CREATE TABLE trailbound.heartbeat_history (LIKE trailbound.heartbeat);
ALTER TABLE trailbound.heartbeat_history ADD PRIMARY KEY (group_name, source, seq, written_at);
CREATE INDEX heartbeat_history_applied ON trailbound.heartbeat_history (group_name, applied_at);

-- GoldenGate's GG_LAG: per replicat and source, the last heartbeat's lag per hop and end
-- to end (seconds), and how long ago it was applied.
CREATE VIEW trailbound.heartbeat_lag AS
SELECT group_name, source, seq, written_at, applied_at,
       extract(epoch FROM archived_at - written_at)                         AS archive_lag,
       extract(epoch FROM captured_at - archived_at)                        AS capture_lag,
       extract(epoch FROM pumped_at - captured_at)                          AS pump_lag,
       extract(epoch FROM applied_at - coalesce(pumped_at, captured_at))    AS replicat_lag,
       extract(epoch FROM applied_at - written_at)                          AS incoming_lag,
       extract(epoch FROM now() - applied_at)                               AS age
  FROM trailbound.heartbeat;

-- Every process that reads a trail (a pump, a replicat) keeps its read position here,
-- updated in the same metadata transaction as its own checkpoint. Trail purge deletes
-- only files that every registered reader has fully passed; a reader registered but
-- never started (seqno 0) holds the whole trail.
CREATE TABLE trailbound.trail_reader (
    trail          text        NOT NULL,   -- the trail prefix it reads (path or URI)
    reader_kind    text        NOT NULL CHECK (reader_kind IN ('pump', 'replicat')),
    group_name     text        NOT NULL,
    seqno          bigint      NOT NULL DEFAULT 0,   -- trail file it is in (0: not started)
    rba            bigint      NOT NULL DEFAULT 0,   -- records of that file already processed
    registered_at  timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trail, reader_kind, group_name)
);

-- The archive catalog: every redo segment capture has discovered, verified and may read.
-- One row per (source, thread, sequence). Rows are never deleted: a purged segment keeps
-- its row (state 'purged') so that sequence continuity and retention history survive.
CREATE TABLE trailbound.archive_segment (
    source        text        NOT NULL,
    thread        integer     NOT NULL CHECK (thread >= 1),
    sequence      bigint      NOT NULL CHECK (sequence >= 1),
    first_scn     bigint      NOT NULL,
    next_scn      bigint      NOT NULL CHECK (next_scn >= first_scn),
    first_time    timestamptz NOT NULL,
    next_time     timestamptz NOT NULL,
    records       bigint      NOT NULL CHECK (records >= 0),
    bytes         bigint      NOT NULL CHECK (bytes >= 0),
    sha256        text        NOT NULL,
    format        text        NOT NULL CHECK (format IN ('parquet', 'jsonl')),
    path          text        NOT NULL,
    closed        boolean     NOT NULL DEFAULT false,
    state         text        NOT NULL DEFAULT 'available' CHECK (state IN ('available', 'purged')),
    cataloged_at  timestamptz NOT NULL DEFAULT now(),
    purged_at     timestamptz,
    PRIMARY KEY (source, thread, sequence)
);

CREATE INDEX archive_segment_next_scn ON trailbound.archive_segment (source, next_scn);

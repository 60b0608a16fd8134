"""Sources: everything that writes the redo archive (docs/redo-archive.md) that capture
reads. Each source turns one kind of database log into segments of the fixed contract
through trailbound.archive.writer, so capture, Bounded Recovery, pump, replicat and
retention work the same whatever wrote the archive."""

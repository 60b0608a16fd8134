-- The source row's version (its xmin) when its image was read: the next compare keeps an
-- in-flight row's older read position only when the row is the same version, not only
-- the same image (compare/confirm.py: a row changed and changed back between two compares
-- shows its old image again). Rows recorded before this migration have none.
ALTER TABLE trailbound.compare_row ADD COLUMN source_version text;

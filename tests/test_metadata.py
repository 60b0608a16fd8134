import threading

import psycopg2

from trailbound.metadata import MetadataStore, migrations, redact


def test_migrations_apply_once_and_are_recorded(empty_database_dsn):
    with MetadataStore.open(empty_database_dsn) as store:
        shipped = [version for version, _, _ in migrations()]
        assert store.applied_migrations() == shipped
        assert store.migrate() == []  # idempotent: nothing left to apply
    with MetadataStore.open(empty_database_dsn) as again:
        assert again.applied_migrations() == shipped


def test_concurrent_starts_apply_each_migration_exactly_once(empty_database_dsn):
    errors = []

    def start():
        try:
            MetadataStore.open(empty_database_dsn).close()
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    from importlib import resources

    migrations = sorted(p.name for p in resources.files("trailbound.sql").joinpath("migrations").iterdir()
                        if p.name.endswith(".sql"))
    with psycopg2.connect(empty_database_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT version, count(*) FROM trailbound.schema_migration GROUP BY version ORDER BY version")
        counts = cur.fetchall()
    assert len(migrations) >= 7 and len(counts) == len(migrations), f"{counts} for {migrations}"
    assert all(count == 1 for _, count in counts)


def test_a_transaction_commits_all_or_nothing(store):
    try:
        with store.transaction() as cur:
            cur.execute("INSERT INTO trailbound.archive_segment (source, thread, sequence, first_scn, next_scn,"
                        " first_time, next_time, records, bytes, sha256, format, path)"
                        " VALUES ('S', 1, 1, 0, 10, now(), now(), 0, 0, 'x', 'jsonl', 'p')")
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    with store.transaction() as cur:
        cur.execute("SELECT count(*) AS n FROM trailbound.archive_segment")
        assert cur.fetchone()["n"] == 0


def test_passwords_never_reach_a_log_line():
    assert "s3cret" not in redact("host=h user=u password=s3cret dbname=d")
    assert "s3cret" not in redact("postgresql://u:s3cret@h:5432/d")
    assert redact("postgresql://u@h/d") == "postgresql://u@h/d"

-- What `make demo` shows of the replica: every table of the target's shop schema with its
-- row count, then the first orders. Run with: psql "$TRAILBOUND_TARGET_DSN" -f THIS_FILE
SELECT format('%I.%I', schemaname, tablename) AS replica_table,
       (xpath('/row/n/text()',
              query_to_xml(format('SELECT count(*) AS n FROM %I.%I', schemaname, tablename), false, true, '')
       ))[1]::text::bigint AS row_count
  FROM pg_tables
 WHERE schemaname = 'shop'
 ORDER BY 1;

\echo
\echo 'shop.orders, its first five rows:'
SELECT * FROM shop.orders ORDER BY id LIMIT 5;

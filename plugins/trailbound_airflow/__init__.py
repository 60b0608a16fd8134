"""trailbound's Airflow extensions: hooks own the I/O, operators are thin, sensors answer
one question each. The DAGs under dags/ are configuration built from these."""

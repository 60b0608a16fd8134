"""The file-system layer (include/trailbound/files.py): Spark tasks write a dataset and
report each file, the driver checks every one through its own view before a checkpoint
may count on it; local paths and Hadoop URIs alike. (The worker whose files the driver
cannot see is in tests/test_cluster.py, on a real standalone cluster.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trailbound import files
from trailbound.durable import file_sha256
from trailbound.errors import TrailError

pytestmark = [pytest.mark.spark]


def _rows(written, spark) -> list[dict]:
    return [row for batch in files.read_batches(written, spark) for row in batch.to_pylist()]


def test_spark_tasks_write_a_dataset_in_order_and_the_driver_checks_each_file(spark, tmp_path):
    # Three ordered partitions (a number given is never coalesced away), so order across files counts.
    df = (spark.range(0, 4000, numPartitions=2).selectExpr("id", "id % 7 AS k", "concat('r', id) AS text")
          .repartitionByRange(3, "k", "id").sortWithinPartitions("k", "id"))
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "part-00042.parquet").write_bytes(b"left by a run that died")
    written = files.write_dataset(df, str(staging), spark)
    assert _rows(written, spark) == [row.asDict() for row in df.collect()], "file name order is the DataFrame's"
    assert sum(f.records for f in written) == 4000 and len(written) == 3
    assert sorted(p.name for p in staging.iterdir()) == [Path(f.location).name for f in written]
    for file in written:
        assert file.sha256 == file_sha256(Path(file.location)) and file.bytes == Path(file.location).stat().st_size
        assert pq.ParquetFile(file.location).metadata.num_rows == file.records

    # A file that is no longer what its task wrote: refused, naming it.
    victim = Path(written[1].location)
    table = pq.read_table(victim)
    pq.write_table(table.slice(0, len(table) - 1), victim)
    with pytest.raises(TrailError) as refused:
        files.verify_written(written, files.LOCAL, writer="a Spark task")
    assert refused.value.path == str(victim) and "nothing was committed" in str(refused.value)
    assert f"a Spark task wrote {written[1].records} records" in str(refused.value)
    victim.unlink()
    with pytest.raises(TrailError, match="not there as this process sees it") as refused:
        files.verify_written(written, files.LOCAL)
    assert refused.value.path == str(victim)


def test_a_hadoop_uri_goes_through_sparks_writer_and_is_checked_record_by_record(spark, tmp_path):
    mount, disk = f"tb{uuid.uuid4().hex[:10]}", tmp_path / "disk"
    disk.mkdir()
    spark._jsc.hadoopConfiguration().set(f"fs.viewfs.mounttable.{mount}.link./staging", disk.as_uri())
    location = f"viewfs://{mount}/staging/run"
    df = spark.range(0, 3000, numPartitions=2).selectExpr("id", "id % 5 AS k").orderBy("id")
    written = files.write_dataset(df, location, spark)
    assert all(f.location.startswith(f"{location}/part-") for f in written)
    assert sum(f.records for f in written) == 3000
    assert _rows(written, spark) == [row.asDict() for row in df.collect()]

    fs = files.for_location(location, spark)
    victim = written[0]
    local = disk / "run" / victim.location.rsplit("/", 1)[1]
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "k": pa.array([1], pa.int64())}), local)
    (local.parent / f".{local.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old bytes
    with pytest.raises(TrailError, match="reads 1 records; nothing was committed") as refused:
        files.verify_written(written, fs, writer="a Spark task")
    assert refused.value.path == victim.location


def test_locations_join_and_split_alike_for_paths_and_uris():
    assert files.join("/var/trails", "rt000000001") == "/var/trails/rt000000001"
    assert files.join("file:///var/x%20y", "a") == "/var/x y/a"
    assert files.join("s3a://bucket/staging/", "part-00000.parquet") == "s3a://bucket/staging/part-00000.parquet"
    assert files.split(files.join("hdfs://nn:8020/d", "rt")) == ("hdfs://nn:8020/d", "rt")

"""trailbound.idle, what the capture and pump tasks ask before spark-submit: "nothing to
do" exactly when a run would do nothing (replicat's check is tested in test_replicat.py,
beside a restored target)."""

from __future__ import annotations

import pytest

from capture_kit import ins, new_archive, rec
from pump_kit import write_config
from trailbound import config as configuration
from trailbound import idle
from trailbound.capture.run import run_extract
from trailbound.pump.run import run_pump

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def test_capture_and_pump_know_when_there_is_nothing_new(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), rec(11, "T1", "COMMIT")], 100)
    config = configuration.load(write_config(tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}}))
    assert idle.capture_idle(store, config, "EXT1", None) is None, "never ran: the run adds the group"
    run_extract(spark, store, config, "EXT1")
    reason = idle.capture_idle(store, config, "EXT1", None)
    assert reason is not None and "nothing new below the horizon" in reason, reason

    assert idle.pump_idle(store, config, "PMP1") is None, "never ran"
    run_pump(None, store, config, "PMP1")
    reason = idle.pump_idle(store, config, "PMP1")
    assert reason is not None and "nothing new" in reason and "after seqno 1" in reason, reason

    archive.segment(1, [ins(110, "T2", 2), rec(111, "T2", "COMMIT")], 200)
    assert idle.capture_idle(store, config, "EXT1", None) is None, "a segment waits to be cataloged"
    assert idle.pump_idle(store, config, "PMP1") is not None, "nothing new in the trail yet"
    run_extract(spark, store, config, "EXT1")
    assert idle.capture_idle(store, config, "EXT1", None) is not None
    assert idle.pump_idle(store, config, "PMP1") is None, "a new trail file to ship"
    run_pump(None, store, config, "PMP1")
    assert idle.pump_idle(store, config, "PMP1") is not None

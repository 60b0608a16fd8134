"""One trail check in a fresh process, as a `validate_trail` task makes it: what a task
process pays for the check, imports included (docs/benchmarks/test-suite.md).

    /work/tools/cgtime .venv/bin/python tests/bench/bench_quality_check.py DIR [--module M]

DIR gets two trail files of 5,000 records (1,000 transactions each) the first time.
--module names the module whose validate_trail_files runs (default trailbound.quality;
an older quality.py saved beside it on PYTHONPATH measures that one).
"""

from __future__ import annotations

import argparse
import importlib
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from trailbound.positions import Scn
from trailbound.trail import format as trails


def write_trail(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    at = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for seqno in range(2):
        rows = []
        for transaction in range(1000):
            csn = seqno * 1000 + transaction + 1
            for k, indicator in enumerate((trails.BEGIN, trails.MIDDLE, trails.MIDDLE, trails.MIDDLE, trails.END)):
                rows.append({"rba": len(rows), "trans_ind": indicator, "csn": csn, "csn_thread": 1,
                             "csn_sequence": 1, "csn_rba": csn, "xid": f"x{csn}", "commit_ts": at, "op": "INSERT",
                             "table": "s.t", "before": None, "after": '{"k": 1}', "src_thread": 1,
                             "src_sequence": 1, "src_rba": csn * 10 + k, "src_scn": csn, "log_bsn": 5})
        schema = pa.schema([f for f in trails.SCHEMA if f.name in rows[0]])
        trails.write_file(directory / "lt", seqno, pa.Table.from_pylist(rows, schema), group="EXT1", log_bsn=Scn(5))
    return sorted(directory.glob("lt*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--module", default="trailbound.quality")
    args = parser.parse_args()
    files = sorted(args.directory.glob("lt*")) or write_trail(args.directory)
    report = importlib.import_module(args.module).validate_trail_files(files, [])
    print(report.describe().splitlines()[0])
    assert report.success, report.describe()


if __name__ == "__main__":
    main()

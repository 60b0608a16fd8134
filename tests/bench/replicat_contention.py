"""What the prepare costs replicat's apply when both run at once (insert-heavy work, two
target sessions). Every chunk of a run is prepared before the clock starts; then the run
applies them while the same prepare runs again beside the apply and its output is
thrown away: in a thread of the run's process (as replicat runs), in a forked child
process, or not at all (the apply alone). docs/benchmarks/replicat.md, "The floor beside
the trail's reading".

    .venv/bin/python tests/bench/replicat_contention.py [--rows N] [--rounds R] [--images-parsed-once]

With --images-parsed-once, the prepare beside the apply finds every image's JSON already
parsed (the first prepare's results, kept): the ceiling for a trail whose images replicat
would not have to parse (docs/benchmarks/replicat.md, "Where insert-heavy time goes").

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench's throwaway server);
uses bench_replicat's databases, work and plain COPY (the median of three). The experiment replaces
`replicat.run._Run.chunks` for the runs of this process (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import threading
import time

import pyarrow as pa

import bench_replicat as bench
from benchdb import fresh_database

MODES = ("none", "thread", "process")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images-parsed-once", action="store_true",
                        help="keep each parsed image table: the prepare beside the apply parses no JSON")
    args = parser.parse_args()

    from trailbound.metadata import MetadataStore, dsn_from_env
    from trailbound.replicat.net import arrow as netarrow
    from trailbound.replicat import run as replicat_run

    work, defs, transactions, files, config = bench.insert_workspace(args.rows, "trailbound-contention-")
    meta_server, target_server = dsn_from_env("TRAILBOUND_METADATA_DSN"), dsn_from_env("TRAILBOUND_TARGET_DSN")
    (copy_seconds, _), _ = bench.median_copy(target_server, defs, transactions)

    if args.images_parsed_once:
        netarrow.parse_images = _parsed_once(netarrow.parse_images)
    prepared_chunks = replicat_run._Run.chunks
    timings: dict[str, float] = {}

    def chunks_beside(mode: str):
        def chunks(self, trail_files, start_rba):
            prepared = list(prepared_chunks(self, trail_files, start_rba))

            def prepare_again() -> None:
                for _ in prepared_chunks(self, trail_files, start_rba):
                    pass

            began = time.perf_counter()
            beside = None
            if mode == "thread":
                beside = threading.Thread(target=prepare_again)
            elif mode == "process":
                beside = multiprocessing.get_context("fork").Process(target=prepare_again)
            if beside is not None:
                beside.start()
            yield from prepared
            timings["apply"] = time.perf_counter() - began
            if beside is not None:
                beside.join()
        return chunks

    def one_run(mode: str) -> tuple[float, str]:
        meta = fresh_database(meta_server, "trailbound_bench_replicat_meta")
        target = fresh_database(target_server, "trailbound_bench_replicat_target")
        bench.create_target(target, defs)
        store = MetadataStore.open(meta)
        bench.register_trail(store, work / "dirdat" / "lt", files)
        replicat_run._Run.chunks = chunks_beside(mode)
        try:
            replicat_run.run_replicat(bench.no_spark, store, config, "REP1", target_dsn=target)
        finally:
            replicat_run._Run.chunks = prepared_chunks
            store.close()
        return timings["apply"], bench.target_digest(target)[:12]

    print(f"{args.rows:,} insert-heavy changes, GROUPTRANSOPS 1000; plain COPY {copy_seconds:.3f} s"
          + ("; images parsed once" if args.images_parsed_once else ""))
    print("| round | the prepare beside the apply | apply | share of COPY | target digest |")
    print("|---|---|---|---|---|")
    for number in range(1, args.rounds + 1):
        for mode in MODES:
            seconds, digest = one_run(mode)
            print(f"| {number} | {mode} | {seconds:.3f} s | {copy_seconds / seconds:.0%} | `{digest}` |", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _parsed_once(parse):
    """parse_images keeping each result: the same images (the same chunk of the same
    trail, read again) come back parsed without parsing. Known by their columns, count,
    size and first and last image, which differ between the chunks of a run."""
    kept = {}

    def parse_images(images, columns, types):
        if isinstance(images, pa.ChunkedArray):
            images = images.combine_chunks()
        key = (columns, len(images), images.nbytes, images[0].as_py() if len(images) else None,
               images[-1].as_py() if len(images) else None)
        if key not in kept:
            kept[key] = parse(images, columns, types)
        return kept[key]
    return parse_images


if __name__ == "__main__":
    sys.exit(main())

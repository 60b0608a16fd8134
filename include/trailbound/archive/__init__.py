"""The redo archive: its contract, segments and manifests, the Spark reader, the catalog.

`contract.py` names the files and fields (docs/redo-archive.md); `writer.py` is how a
source writes (sources/ and tests use it); `segments.py` reads and verifies one segment
and its manifest; `reader.py` is the Spark reader; `catalog.py` the metadata store's
record of verified segments and the horizon. Capture, retention, sources and the command
line import it; it imports nothing of the engine above `errors`, `positions`, `durable`
and `metadata`.
"""

"""The Python backend: net change in plain Python, for the few records arrow.py leaves
(the (unit, table)s with a key-changing UPDATE): the lifetimes and COPY lines of the
contract (net/__init__.py: read its docstring), without starting a JVM.

Key changes are rare, and a replicat run that meets a few of them used to start Spark
for them: a JVM and a session (5-10 s on two CPUs) to net a handful of records. Here
they take ~25 us each, in the thread that prepares the next chunk while one is applied.
Measured (bench_replicat.py --work keychange, 300,000 changes, docs/benchmarks/
replicat.md): 7.1 s in Python against 17.9 s on an already warm local Spark. Replicat
hands Spark (spark.py) only a chunk with more of them than `LIMIT` (net.backend_for): a
full chunk (the replicat's chunk_records, 250,000 by default; a longer transaction comes
in pieces of that size) is netted here; a bigger one (a larger chunk_records) is left to
Spark, which nets it without holding it as Python objects in the driver.

Values are the images' JSON values as text, as Spark's `from_json` into string fields
gives them: strings as they are, integers and floats in the image's own spelling,
booleans as true/false. (Java spells some floats differently, 1.0E-300 for 1e-300:
PostgreSQL reads both as the same double.)
"""

from __future__ import annotations

import json

import pyarrow as pa

from trailbound.archive.writer import encode_json
from trailbound.replicat.net import (CARRIES_IMAGE, DELETED, ENDS, MODIFY, MOVED_IN, MOVED_OUT, NEW, Backend, Shape,
                                     Shapes, lines_of, resolve_chains)

# The most records of key-changing (unit, table)s per chunk netted here; more go to Spark.
LIMIT = 300_000


# Numbers as their own text; one decoder (json.loads with these options builds one per call).
_DECODER = json.JSONDecoder(parse_int=str, parse_float=str)


def _image(text: str | None) -> dict:
    if text is None:
        return {}
    return {name: _text(value) for name, value in _DECODER.decode(text).items()}


def _text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return encode_json(value)  # a nested object or array (outside the contract): its JSON text


def _touches(op: str, before: dict, after: dict, shape: Shape) -> list[tuple[tuple, str]]:
    """The (key, role) pairs one record touches: a key-changing UPDATE touches two keys."""
    if op == "INSERT":
        return [(tuple(after.get(k) for k in shape.key), NEW)]
    old = tuple(before.get(k) for k in shape.key)
    if op == "DELETE":
        return [(old, DELETED)]
    new = tuple(after[k] if k in after else before.get(k) for k in shape.key)
    if old == new:
        return [(new, MODIFY)]
    return [(old, MOVED_OUT), (new, MOVED_IN)]


def net_lines(records: list[dict], shapes: dict[str, Shape]) -> pa.Table:
    """records: unit, seq (commit order), table, op, before, after (the applied DML
    records of some (unit, table)s). Returns their COPY lines as spark.copy_lines
    writes them (chains resolved, as spark.net_table does), net.LINES_SCHEMA."""
    lifetimes: dict[tuple, list[dict]] = {}   # (unit, table, key) -> its lifetimes in order
    for record in sorted(records, key=lambda r: r["seq"]):
        shape = shapes[record["table"]]
        before, after = _image(record["before"]), _image(record["after"])
        for key, role in _touches(record["op"], before, after, shape):
            on_key = lifetimes.setdefault((record["unit"], record["table"], key), [])
            if not on_key or on_key[-1]["last_role"] in ENDS:
                on_key.append({"unit": record["unit"], "table": record["table"], "okey": list(key),
                               "first_seq": record["seq"], "first_role": role, "vals": {}})
            life = on_key[-1]
            life["last_seq"], life["last_role"] = record["seq"], role
            if role in CARRIES_IMAGE:
                # An INSERT's image is the whole row; an UPDATE's carries what it names.
                life["vals"].update(after if record["op"] != "INSERT" else
                                    {c: after.get(c) for c in shape.columns})
    rows, linked = [], []
    for on_key in lifetimes.values():
        for life in on_key:
            life["vals"] = {c: v for c, v in life["vals"].items() if c in shapes[life["table"]].columns}
            first, last = life["first_role"], life["last_role"]
            if first == MOVED_IN or last == MOVED_OUT:
                linked.append(life)
                continue
            kind = ("I" if last != DELETED else None) if first == NEW else "D" if last == DELETED else "U"
            if kind is not None:  # None: inserted and deleted again, nothing to apply
                rows.append({"unit": life["unit"], "table": life["table"], "kind": kind,
                             "okey": None if kind == "I" else life["okey"],
                             "vals": None if kind == "D" else life["vals"]})
    return lines_of(rows + resolve_chains(linked), shapes)


def net_table(records: pa.Table, shapes: Shapes, start_spark, workdir) -> pa.Table:
    """The backend (net.Backend): `records` as dicts, netted here (no session, no files)."""
    return net_lines(records.to_pylist(), shapes)


BACKEND = Backend("python", "prepare: net change (key changes, Python)", net_table)

"""A live PostgreSQL source: a log miner that archives the WAL through logical decoding.

    decoder.py     pgoutput (protocol version 2) bytes -> typed messages, nothing else
    reader.py      the replication connection: reads a slot up to a position, keepalives,
                   feedback only when told what is durable
    miner.py       messages -> archive records and segments, then confirms the slot
    values.py      pgoutput's text values -> the archive's JSON values
    rowjson.py     the pull's hot path: a row change's tuple bytes straight to its JSON images
    state.py       what the miner remembers to archive re-sent changes once
    admin.py       add / delete / alter / info source: publication, slot, defs.json from the catalog
    heartbeat.py   the source's heartbeat table: created by add heartbeattable, written by each pull
    continuity.py  is the slot still the one the archive was pulled from: a gap is refused
    snapshot.py    the slot made again with an exported snapshot: the initial load's
                   consistent point
    lsn.py         Lsn, the WAL position type

docs/live-postgres.md describes set-up, commands and semantics.
"""

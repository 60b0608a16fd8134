"""A live PostgreSQL source: a log miner that archives the WAL through logical decoding.

    decoder.py   pgoutput (protocol version 2) bytes -> typed messages, nothing else
    reader.py    the replication connection: reads a slot up to a position, keepalives,
                 feedback only when told what is durable
    miner.py     messages -> archive records and segments, then confirms the slot
    catalog.py   publication, slot and defs.json from the source's catalog (add/delete/info)

docs/live-postgres.md describes set-up, commands and semantics.
"""

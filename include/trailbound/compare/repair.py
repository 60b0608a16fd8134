"""The repair script of a compare: SQL that brings the target's rows in line with what
the source showed, for the rows confirmed out of sync (never the in-flight ones).

Values are the source's text forms as literals: PostgreSQL reads each into the target
column's type (an INSERT's or UPDATE's literal takes the column's type; a key compared
with a literal too). The script sets the session's text forms first, the ones the
compare read them in. Identifiers are quoted by psycopg2.sql, values are literals.
"""

from __future__ import annotations

from psycopg2 import sql

from trailbound.compare.confirm import lsn_text
from trailbound.compare.run import CompareReport
from trailbound.compare.sides import SESSION


def _value(text) -> sql.Composable:
    return sql.SQL("NULL") if text is None else sql.Literal(text)


def _insert(relation, columns, image) -> sql.Composable:
    return sql.SQL("INSERT INTO {} ({}) VALUES ({});").format(
        relation, sql.SQL(", ").join(map(sql.Identifier, columns)), sql.SQL(", ").join(map(_value, image)))


def _where_key(key_names, key) -> sql.Composable:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(name), _value(value))
                                 for name, value in zip(key_names, key))


def statements(report: CompareReport) -> list[sql.Composable]:
    out = []
    for table in report.tables:
        spec = table.spec
        relation = sql.Identifier(*spec.target_rel)
        for d in table.out_of_sync:
            kind = d.kind()
            if spec.keyless:  # d.key is the whole row; images are counts
                if kind == "missing":
                    out += [_insert(relation, spec.columns, d.key)] * d.count()
                else:
                    same = sql.SQL(" AND ").join(sql.SQL("{}::text IS NOT DISTINCT FROM {}").format(
                        sql.Identifier(c), _value(v)) for c, v in zip(spec.columns, d.key))
                    out.append(sql.SQL("DELETE FROM {rel} WHERE ctid IN (SELECT ctid FROM {rel} WHERE {same} "
                                       "LIMIT {n});").format(rel=relation, same=same, n=sql.Literal(d.count())))
            elif kind == "missing":
                out.append(_insert(relation, spec.columns, d.source))
            elif kind == "extra":
                out.append(sql.SQL("DELETE FROM {} WHERE {};").format(relation, _where_key(spec.key, d.key)))
            else:
                changed = d.columns(spec.columns)
                out.append(sql.SQL("UPDATE {} SET {} WHERE {};").format(
                    relation, sql.SQL(", ").join(sql.SQL("{} = {}").format(
                        sql.Identifier(c), _value(d.source[spec.columns.index(c)])) for c in changed),
                    _where_key(spec.key, d.key)))
    return out


def script(report: CompareReport, connection) -> str:
    """The whole script as text (`connection` quotes the literals as its server would)."""
    lines = [f"-- trailbound compare run {report.run_id}: repair of replicat {report.replicat}'s target from source "
             f"{report.source}",
             f"-- {report.out_of_sync} row(s) confirmed out of sync (the replicat had applied through "
             f"{lsn_text(report.applied)}); rows in flight are left alone.",
             "-- Each statement sets a target row to what the source showed when compared.",
             *(f"SET {name} = {sql.Literal(value).as_string(connection)};" for name, value in SESSION.items()
               if name != "default_transaction_read_only"),
             "BEGIN;"]
    lines += [statement.as_string(connection) for statement in statements(report)]
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"

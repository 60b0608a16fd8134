"""The key-range SQL under its old name, for sources/postgres/keyranges.py, which still
imports it from here: it lives in trailbound/keyrange.py (replicat uses it too, and
replicat never imports the load). Import it from there.
"""

from trailbound.keyrange import bound_row, key_row, range_condition

__all__ = ["bound_row", "key_row", "range_condition"]

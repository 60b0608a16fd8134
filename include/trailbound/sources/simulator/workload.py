"""The simulated workload: what the shop and HR do, one change per step. Each transaction
story is a generator the engine advances one record at a time; the long stories, the
truncates and the handoffs are scheduled at fixed fractions of the duration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from trailbound.sources.simulator.pools import (
    AWKWARD_TEXTS,
    BIG_INTS,
    COUNTRIES,
    DEPARTMENTS,
    DISCOUNTS,
    FIRST_NAMES,
    INT_ARRAYS,
    JSONB_VALUES,
    LARGE_TEXTS,
    LAST_NAMES,
    PRECISE_NUMERICS,
    REFERRERS,
    SCORES,
    STATUS_FLOW,
    TEXT_ARRAYS,
    URLS,
)
from trailbound.sources.simulator.tables import (
    CARTS,
    CUSTOMERS,
    EMPLOYEES,
    INVENTORY,
    KUNDEN,
    LINES,
    ORDERS,
    PAGE_VIEWS,
    REVIEWS,
    TIMESHEETS,
    SimTable,
)

if TYPE_CHECKING:
    from trailbound.sources.simulator.engine import Simulator, Txn

# Long stories: (workload method, start, length, outcome); start and length are fractions
# of the duration (hours at the default 48 h in the comments). A length of None: never ends.
LONG_STORIES = (
    ("repricing", 0.05, 6 / 48, "commit"),         # 6 h, holds inventory row locks throughout
    ("annual_review", 0.08, 26 / 48, "commit"),    # 26 h, with a savepoint rolled back inside
    ("bulk_import", 0.30, 4 / 48, "rollback"),     # 4 h of inserts, then all rolled back
    ("stuck_session", 0.62, None, "open"),         # one change, then idle in transaction forever
    ("slow_migration", 0.85, None, "open"),        # still writing when the archive ends
)
# TRUNCATE of shop.cart_sessions, as fractions of the duration (every ~5 h at 48 h).
TRUNCATE_TIMES = tuple(0.07 + 0.1 * n for n in range(10))
# Handoffs of one row between two threads at one SCN (Simulator._handoff).
HANDOFF_TIMES = tuple(0.1 + 0.04 * n for n in range(20))


class Workload:
    """Transaction stories. Each is a generator: it makes one change (one record) and
    yields, so the main loop can interleave it with the others."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        self.random = sim.rng.random
        self.t = sim.table
        stories = [
            (22, self.order_story), (18, self.fulfilment_story), (14, self.browsing_story),
            (9, self.customer_care_story), (8, self.inventory_story), (12, self.hr_story),
            (6, self.kunden_story), (6, self.cart_story), (5, self.savepoint_story),
        ]
        total = sum(weight for weight, _ in stories)
        cumulative = 0.0
        self.stories = []
        for weight, story in stories:
            cumulative += weight / total
            self.stories.append((cumulative, story))

    def story(self, txn: Txn) -> Iterator:
        r = self.random()
        for threshold, story in self.stories:
            if r < threshold:
                return story(txn)
        return self.stories[-1][1](txn)

    # ---- small helpers -----------------------------------------------------------------

    def choice(self, pool: list):
        return pool[int(self.random() * len(pool))]

    def below(self, n: int) -> int:
        return int(self.random() * n)

    def chance(self, p: float) -> bool:
        return self.random() < p

    def money(self) -> str:
        cents = 100 + self.below(10_000_000)
        return f"{cents // 100}.{cents % 100:02d}"

    def precise(self) -> str:
        """numeric with 20 significant digits (a double would lose them)."""
        if self.chance(0.05):
            return self.choice(PRECISE_NUMERICS)
        return f"{10_000 + self.below(90_000)}.{self.below(10 ** 15):015d}"

    def today(self) -> str:
        return self.sim.now_text()[:10]

    def commit_or_rollback(self, txn: Txn, rollback_rate: float | None = None) -> None:
        rate = self.sim.rollback_rate if rollback_rate is None else rollback_rate
        self.sim.end(txn, commit=not self.chance(rate))

    def trim(self, txn: Txn, table: SimTable, inserted: int = 1) -> Iterator:
        """Keep a table near its cap: once it is full, a delete for every row inserted."""
        for _ in range(inserted):
            if len(table.rows) <= table.cap:
                return
            picked = self.sim.pick(txn, table)
            if picked is None:
                return
            self.sim.delete(txn, table, *picked, full_before=self.chance(0.3))
            yield

    def roll_back_to(self, txn: Txn, level: int) -> Iterator:
        for sub_xid in self.sim.undo_savepoints(txn, level):
            self.sim.roll_back_subtransaction(txn, sub_xid)
            yield

    # ---- rows ------------------------------------------------------------------------

    def customer_row(self) -> dict:
        sim = self.sim
        customer_id = self.t[CUSTOMERS].new_id()
        notes = None
        r = self.random()
        if r < 0.005:
            notes = self.choice(LARGE_TEXTS)
            sim.features["large_values"] += 1
        elif r < 0.2:
            notes = self.choice(AWKWARD_TEXTS)
        return {
            "id": customer_id,
            "name": f"{self.choice(FIRST_NAMES)} {self.choice(LAST_NAMES)}",
            "email": None if r > 0.95 else ("" if r > 0.93 else f"user{customer_id}@example.com"),
            "country": self.choice(COUNTRIES),
            "created_at": sim.now_text(),
            "vip": r < 0.1,
            "notes": notes,
        }

    def order_row(self, customer_id: int) -> dict:
        return {
            "id": self.t[ORDERS].new_id(),
            "customer_id": customer_id,
            "status": "new",
            "total": self.money(),
            "ordered_at": self.sim.now_text(),
            "ship_date": None,
            "items": self.choice(INT_ARRAYS),
            "meta": self.choice(JSONB_VALUES) if self.chance(0.7) else None,
        }

    def line_row(self, order_id: int) -> dict:
        return {
            "order_id": order_id,
            "line_no": self.t[LINES].new_id(),
            "sku": f"SKU-{self.below(5000):06d}",
            "qty": 1 + self.below(5),
            "price": self.money(),
            "discount": self.choice(DISCOUNTS),
        }

    def inventory_row(self) -> dict:
        return {
            "sku": f"SKU-{self.t[INVENTORY].new_id():06d}",
            "on_hand": self.below(1000),
            "reserved": 0,
            "price": self.precise(),
            "updated_at": self.sim.now_text(),
        }

    def kunden_row(self) -> dict:
        return {"Kunden-Nr": self.t[KUNDEN].new_id(), **self.kunden_values()}

    def kunden_values(self) -> dict:
        return {
            "select": self.choice(AWKWARD_TEXTS),
            "Mixed Case": self.choice(AWKWARD_TEXTS) if self.chance(0.8) else None,
            "naïve": self.choice([True, False, None]),
            "from": self.today() if self.chance(0.8) else None,
            "payload": "\\x" + self.sim.rng.getrandbits(64).to_bytes(8, "big").hex() if self.chance(0.8) else self.choice(["\\x", None]),
            "score": self.choice(SCORES),
            "tags": self.choice(TEXT_ARRAYS) if self.chance(0.8) else None,
            "big": self.choice(BIG_INTS),
        }

    def page_view_row(self) -> dict:
        return {
            "session": f"s-{self.below(100_000):05x}",
            "url": self.choice(URLS),
            "seen_at": self.sim.unique_now_text(),
            "hits": 1,
            "referrer": self.choice(REFERRERS),
        }

    def cart_row(self) -> dict:
        return {
            "session_id": self.t[CARTS].new_id(),
            "customer_id": self.below(20_000) if self.chance(0.7) else None,
            "started_at": self.sim.now_text(),
            "data": self.choice(JSONB_VALUES),
        }

    def employee_row(self) -> dict:
        return {
            "emp_id": self.t[EMPLOYEES].new_id(),
            "full_name": f"{self.choice(FIRST_NAMES)} {self.choice(LAST_NAMES)}",
            "dept": self.choice(DEPARTMENTS),
            "salary": f"{40_000 + self.below(80_000)}.00",
            "hired": self.today(),
            "manager_id": None if self.chance(0.2) else 1_000 + self.below(50),
            "active": True,
        }

    def timesheet_row(self, emp_id: int) -> dict:
        return {
            "id": self.t[TIMESHEETS].new_id(),
            "emp_id": emp_id,
            "day": self.today(),
            "hours": self.choice([8.0, 7.5, 4.25, 0.5, 10.0, 6.333333333333333]),
            "note": self.choice(AWKWARD_TEXTS) if self.chance(0.3) else None,
        }

    def review_row(self, customer_id: int) -> dict:
        return {
            "id": self.t[REVIEWS].new_id(),
            "customer_id": customer_id,
            "stars": 1 + self.below(5),
            "body": self.choice(AWKWARD_TEXTS) if self.chance(0.6) else None,
            "written_at": self.sim.now_text(),
        }

    def row_for(self, table: SimTable) -> dict:
        """A new row of any table a schema change writes to (changes.py)."""
        rows = {CUSTOMERS: self.customer_row, TIMESHEETS: lambda: self.timesheet_row(1_000 + self.below(50)),
                REVIEWS: lambda: self.review_row(self.below(20_000))}
        return rows[table.name]()

    # ---- short transactions --------------------------------------------------------------

    def order_story(self, txn: Txn) -> Iterator:
        sim, t = self.sim, self.t
        if self.chance(0.4):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, t[CUSTOMERS])
        if picked is None:
            customer = self.customer_row()
            sim.insert(txn, t[CUSTOMERS], customer)
            yield
        else:
            customer = picked[1]
        order = self.order_row(customer["id"])
        sim.insert(txn, t[ORDERS], order)
        yield
        lines = 1 + self.below(4)
        for _ in range(lines):
            sim.insert(txn, t[LINES], self.line_row(order["id"]))
            yield
        if self.chance(0.1):  # the customer adds an item, and sometimes takes it out again
            sim.savepoint(txn)
            sim.insert(txn, t[LINES], self.line_row(order["id"]))
            yield
            if self.chance(0.5):
                yield from self.roll_back_to(txn, 0)
            else:
                sim.release(txn)
        if self.chance(0.5):
            picked = sim.pick(txn, t[INVENTORY])
            if picked is not None:
                ident, item = picked
                sim.update(txn, t[INVENTORY], ident, item,
                           {"on_hand": item["on_hand"] - 1, "reserved": item["reserved"] + 1,
                            "updated_at": sim.now_text()})
                yield
        yield from self.trim(txn, t[ORDERS])
        yield from self.trim(txn, t[LINES], lines)
        yield from self.trim(txn, t[CUSTOMERS])
        self.commit_or_rollback(txn)

    def fulfilment_story(self, txn: Txn) -> Iterator:
        sim, t = self.sim, self.t
        if self.chance(0.3):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, t[ORDERS])
        if picked is None:
            sim.insert(txn, t[PAGE_VIEWS], self.page_view_row())
            yield
        else:
            ident, order = picked
            r = self.random()
            if r < 0.05:  # order withdrawn
                sim.delete(txn, t[ORDERS], ident, order, full_before=self.chance(0.5))
                yield
            else:
                status = STATUS_FLOW[order["status"]]
                changes = {"status": status}
                if status == "shipped":
                    changes["ship_date"] = self.today()
                if r < 0.15:
                    changes["meta"] = self.choice(JSONB_VALUES)
                sim.update(txn, t[ORDERS], ident, order, changes, full_before=self.chance(0.3))
                yield
        r = self.random()
        if r < 0.4:
            picked = sim.pick(txn, t[LINES])
            if picked is not None:
                ident, line = picked
                if r < 0.2:
                    sim.delete(txn, t[LINES], ident, line, full_before=self.chance(0.5))
                elif r < 0.3:  # renumbered: a primary-key update
                    sim.update(txn, t[LINES], ident, line,
                               {"line_no": t[LINES].new_id(), "qty": 1 + self.below(9)},
                               full_before=self.chance(0.5))
                else:
                    sim.update(txn, t[LINES], ident, line,
                               {"discount": self.choice(DISCOUNTS)}, full_before=self.chance(0.3))
                yield
        self.commit_or_rollback(txn)

    def browsing_story(self, txn: Txn) -> Iterator:
        """The keyless table: updates and deletes identify rows by all their columns."""
        sim, views = self.sim, self.t[PAGE_VIEWS]
        inserted = 1 + self.below(3)
        for _ in range(inserted):
            sim.insert(txn, views, self.page_view_row())
            yield
        r = self.random()
        if r < 0.5:
            picked = sim.pick(txn, views)
            if picked is not None:
                ident, view = picked
                if r < 0.3:
                    changes = {"hits": view["hits"] + 1}
                    if self.chance(0.3):
                        changes["referrer"] = self.choice(REFERRERS)
                    sim.update(txn, views, ident, view, changes)
                else:
                    sim.delete(txn, views, ident, view)
                yield
        yield from self.trim(txn, views, inserted)
        self.commit_or_rollback(txn)

    def customer_care_story(self, txn: Txn) -> Iterator:
        sim, customers = self.sim, self.t[CUSTOMERS]
        if self.chance(0.3):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, customers)
        if picked is None or self.chance(0.2):
            sim.insert(txn, customers, self.customer_row())
            yield
        if picked is not None:
            ident, customer = picked
            r = self.random()
            if r < 0.06:  # customer number changed: a primary-key update
                sim.update(txn, customers, ident, customer, {"id": customers.new_id()},
                           full_before=self.chance(0.5))
            elif r < 0.10:
                sim.delete(txn, customers, ident, customer, full_before=self.chance(0.5))
            else:
                changes = {}
                if self.chance(0.5):
                    changes["email"] = self.choice([None, "", f"new{self.below(10**6)}@example.org"])
                if self.chance(0.4):
                    changes["country"] = self.choice(COUNTRIES)
                if self.chance(0.3) or not changes:
                    changes["vip"] = not customer["vip"]
                if self.chance(0.2):
                    if self.chance(0.05):
                        changes["notes"] = self.choice(LARGE_TEXTS)
                        sim.features["large_values"] += 1
                    else:
                        changes["notes"] = self.choice(AWKWARD_TEXTS + [None])
                sim.update(txn, customers, ident, customer, changes, full_before=self.chance(0.3))
            yield
        reviews = self.t.get(REVIEWS)  # once a schema change created it
        if reviews is not None and picked is not None and self.chance(0.3):
            sim.insert(txn, reviews, self.review_row(picked[1]["id"]))
            yield
            yield from self.trim(txn, reviews)
        yield from self.trim(txn, customers)
        self.commit_or_rollback(txn)

    def inventory_story(self, txn: Txn) -> Iterator:
        sim, inventory = self.sim, self.t[INVENTORY]
        for _ in range(1 + self.below(3)):
            picked = sim.pick(txn, inventory)
            if picked is None or (len(inventory.rows) < inventory.cap and self.chance(0.1)):
                sim.insert(txn, inventory, self.inventory_row())
            else:
                ident, item = picked
                changes = {"on_hand": item["on_hand"] + self.below(50), "updated_at": sim.now_text()}
                if self.chance(0.2):
                    changes["price"] = self.precise()
                if self.chance(0.2):
                    changes["reserved"] = 0
                sim.update(txn, inventory, ident, item, changes, full_before=self.chance(0.3))
            yield
        self.commit_or_rollback(txn)

    def hr_story(self, txn: Txn) -> Iterator:
        """Touches the hr schema only (table-selection tests rely on that)."""
        sim, employees, timesheets = self.sim, self.t[EMPLOYEES], self.t[TIMESHEETS]
        if self.chance(0.5):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, employees)
        if picked is None or self.chance(0.1):
            employee = self.employee_row()
            sim.insert(txn, employees, employee)
            yield
        else:
            ident, employee = picked
            r = self.random()
            if r < 0.05:  # re-numbered: a primary-key update
                sim.update(txn, employees, ident, employee, {"emp_id": employees.new_id()},
                           full_before=self.chance(0.5))
                yield
            elif r < 0.35:
                column = self.choice(["dept", "salary", "manager_id", "active"])
                if column == "dept":
                    value = self.choice(DEPARTMENTS)
                elif column == "salary":
                    value = f"{40_000 + self.below(80_000)}.{self.below(100):02d}"
                elif column == "manager_id":
                    value = None if self.chance(0.3) else 1_000 + self.below(50)
                else:
                    value = not employee["active"]
                changes = {column: value}
                sim.update(txn, employees, ident, employee, changes, full_before=self.chance(0.3))
                yield
        inserted = 1 + self.below(2)
        for _ in range(inserted):
            sim.insert(txn, timesheets, self.timesheet_row(employee["emp_id"]))
            yield
        if self.chance(0.1):
            picked = sim.pick(txn, timesheets)
            if picked is not None:
                sim.delete(txn, timesheets, *picked, full_before=self.chance(0.3))
                yield
        yield from self.trim(txn, timesheets, inserted)
        self.commit_or_rollback(txn)

    def kunden_story(self, txn: Txn) -> Iterator:
        """The table with the awkward name, columns and values."""
        sim, kunden = self.sim, self.t[KUNDEN]
        picked = sim.pick(txn, kunden)
        r = self.random()
        if picked is None or r < 0.4:
            sim.insert(txn, kunden, self.kunden_row())
        else:
            ident, row = picked
            if r < 0.48:
                sim.update(txn, kunden, ident, row, {"Kunden-Nr": kunden.new_id()},
                           full_before=self.chance(0.5))
            elif r < 0.58:
                sim.delete(txn, kunden, ident, row, full_before=self.chance(0.5))
            else:
                fresh = self.kunden_values()
                columns = [c for c in fresh if self.chance(0.3)] or ["select"]
                sim.update(txn, kunden, ident, row, {c: fresh[c] for c in columns},
                           full_before=self.chance(0.3))
        yield
        yield from self.trim(txn, kunden)
        self.commit_or_rollback(txn)

    def cart_story(self, txn: Txn) -> Iterator:
        sim, carts = self.sim, self.t[CARTS]
        if not sim.available(txn, carts):  # a TRUNCATE has the table: browse instead
            sim.insert(txn, self.t[PAGE_VIEWS], self.page_view_row())
            yield
            self.commit_or_rollback(txn)
            return
        sim.insert(txn, carts, self.cart_row())
        yield
        r = self.random()
        if r < 0.7:
            picked = sim.pick(txn, carts)
            if picked is not None:
                ident, cart = picked
                if r < 0.4:
                    sim.update(txn, carts, ident, cart, {"data": self.choice(JSONB_VALUES)},
                               full_before=self.chance(0.3))
                else:
                    sim.delete(txn, carts, ident, cart, full_before=self.chance(0.3))
                yield
        yield from self.trim(txn, carts)
        self.commit_or_rollback(txn)

    def any_change(self, txn: Txn) -> None:
        """Exactly one change to some shop or hr table (the body of savepoints)."""
        sim, t = self.sim, self.t
        r = self.random()
        if r < 0.25:
            picked = sim.pick(txn, t[CUSTOMERS])
            if picked is not None:
                ident, customer = picked
                sim.update(txn, t[CUSTOMERS], ident, customer, {"vip": not customer["vip"]},
                           full_before=self.chance(0.3))
                return
        elif r < 0.45:
            picked = sim.pick(txn, t[ORDERS])
            if picked is not None:
                ident, order = picked
                sim.update(txn, t[ORDERS], ident, order, {"status": STATUS_FLOW[order["status"]]})
                return
        elif r < 0.6:
            picked = sim.pick(txn, t[PAGE_VIEWS])
            if picked is not None:
                sim.delete(txn, t[PAGE_VIEWS], *picked)
                return
        elif r < 0.75:
            sim.insert(txn, t[TIMESHEETS], self.timesheet_row(1_000 + self.below(50)))
            return
        sim.insert(txn, t[PAGE_VIEWS], self.page_view_row())

    def savepoint_story(self, txn: Txn) -> Iterator:
        """A random walk over savepoints: nested ones, released ones, rolled back ones."""
        sim = self.sim
        if self.chance(0.3):
            sim.begin(txn)
            yield
        for _ in range(3 + self.below(6)):
            depth = len(txn.savepoints)
            r = self.random()
            if r < 0.35 and depth < 3:
                sim.savepoint(txn)
                self.any_change(txn)  # every savepoint writes, so it exists in the log
                yield
            elif r < 0.55 or depth == 0:
                self.any_change(txn)
                yield
            elif r < 0.75:
                sim.release(txn)
            else:
                yield from self.roll_back_to(txn, self.below(depth))
        while txn.savepoints:
            sim.release(txn)
        self.commit_or_rollback(txn, rollback_rate=0.1)

    # ---- scheduled stories -------------------------------------------------------------

    def truncate_story(self, txn: Txn, carts: SimTable, commit: bool, in_savepoint: bool) -> Iterator:
        """TRUNCATE shop.cart_sessions once every other user of it has finished."""
        sim = self.sim
        if in_savepoint:  # truncate, change one's mind, truncate again
            sim.savepoint(txn)
            while not sim.try_truncate(txn, carts):
                yield
            yield
            sim.insert(txn, carts, self.cart_row())
            yield
            yield from self.roll_back_to(txn, 0)
        while not sim.try_truncate(txn, carts):
            yield
        yield
        for _ in range(1 + self.below(3)):
            sim.insert(txn, carts, self.cart_row())
            yield
        sim.end(txn, commit)

    def reprice_or_stock(self, txn: Txn, ident=None):
        """Reprice an inventory item (the given one, else any), or stock a new one if
        there is none to take; returns the item's key."""
        sim, inventory = self.sim, self.t[INVENTORY]
        if ident is None:
            picked = sim.pick(txn, inventory)
        else:
            row = sim.pick_row(txn, inventory, ident)
            picked = None if row is None else (ident, row)
        if picked is None:
            item = self.inventory_row()
            sim.insert(txn, inventory, item)
            return item["sku"]
        ident, item = picked
        sim.update(txn, inventory, ident, item, {"price": self.precise(), "updated_at": sim.now_text()})
        return ident

    def repricing(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        """Reprices inventory one item at a time, holding every row it touched for hours."""
        sim, inventory = self.sim, self.t[INVENTORY]
        sim.begin(txn)
        yield every
        while sim.now_us() < until:
            picked = sim.pick(txn, inventory)
            if picked is None:
                sim.insert(txn, inventory, self.inventory_row())
            else:
                ident, item = picked
                sim.update(txn, inventory, ident, item, {"price": self.precise(), "updated_at": sim.now_text()})
            yield every
        sim.end(txn, outcome == "commit")

    def annual_review(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        """Salary review over a day and more, hr only; one raise is taken back midway."""
        sim, employees = self.sim, self.t[EMPLOYEES]
        steps = 0
        while sim.now_us() < until:
            steps += 1
            if steps == 10:
                sim.savepoint(txn)
            picked = sim.pick(txn, employees)
            if picked is None:
                sim.insert(txn, employees, self.employee_row())
            else:
                ident, employee = picked
                sim.update(txn, employees, ident, employee,
                           {"salary": f"{40_000 + self.below(90_000)}.{self.below(100):02d}"},
                           full_before=True)
            yield every
            if steps == 11:
                for _ in self.roll_back_to(txn, 0):
                    yield every
        sim.end(txn, outcome == "commit")

    def bulk_import(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        sim, customers = self.sim, self.t[CUSTOMERS]
        sim.begin(txn)
        yield every
        while sim.now_us() < until:
            sim.insert(txn, customers, self.customer_row())
            yield every
        sim.end(txn, outcome == "commit")

    def stuck_session(self, txn: Txn, until: int | None, every: int, outcome: str) -> Iterator[int]:
        """One change, then idle in transaction: never commits."""
        sim = self.sim
        picked = sim.pick(txn, self.t[KUNDEN])
        if picked is None:
            sim.insert(txn, self.t[KUNDEN], self.kunden_row())
        else:
            sim.update(txn, self.t[KUNDEN], *picked, {"select": "locked by a forgotten session"})
        yield every

    def slow_migration(self, txn: Txn, until: int | None, every: int, outcome: str) -> Iterator[int]:
        """Copies timesheets slowly and is still at it when the archive ends."""
        sim = self.sim
        while True:
            sim.insert(txn, self.t[TIMESHEETS], self.timesheet_row(1_000 + self.below(50)))
            yield every

"""The data pools the workload draws from: awkward values in the contract's value encoding
(PostgreSQL text input forms), large values, and hostile transaction ids."""

from __future__ import annotations

from collections.abc import Callable

from trailbound.archive.contract import MAX_XID_LENGTH

FIRST_NAMES = ["Anna", "Zoë", "José", "Łukasz", "Søren", "Nguyễn", "O'Neil", "Иван", "李",
               "さくら", "Mary-Jane", "Renée", "D'Angelo", "Åsa", "Chloé"]
LAST_NAMES = ["Müller", "O'Brien", "García", "van der Berg", "Ødegaard", 'Smith "Smitty"', "王",
              "山田", "Ñúñez", "Back\\slash", "Ångström", "Dupont", "Nowak-Kowalska"]
COUNTRIES = ["DE", "FR", "JP", "US", "BR", "NO", "CN", "", None]
STATUS_FLOW = {"new": "paid", "paid": "packed", "packed": "shipped", "shipped": "delivered",
               "delivered": "returned", "returned": "cancelled", "cancelled": "new"}
AWKWARD_TEXTS = [
    "O'Brien's \"quoted\" note", "back\\slash \\N and \\\\", "C:\\temp\\new", "Zoë Ångström",
    "北京市朝阳区", "東京都渋谷区", "서울특별시", "emoji 🚀🎉👩‍👩‍👧", "e\u0301 (e + combining acute)",
    "", " ", "tab\tand\nnewline\r\n", "NULL", "null", "\\x00 is not a byte", "'; DROP TABLE x; --",
    "Ω≈ç√∫ ﬁ ligature", "zero\u200bwidth", "עברית RTL", "a,b,{c}", "$$dollar$$", "%s %d {0}",
]
URLS = ["/", "/cart", "/produkt/über-uns", "/search?q=a%20b&x=1", "/商品/123", "/path with space",
        "/emoji/🚀", "/a/../b", "/'quote'"]
REFERRERS = [None, "", "https://example.com/", "https://例え.jp/", "https://x.test/?q=\"a\""]
JSONB_VALUES = ['{"channel": "web"}', '{"gift": true, "note": "naïve \\"quoted\\""}',
                '{"n": 1.5, "tags": ["a", "b"]}', "{}", "[]", '"just a string"', "null",
                '{"emoji": "🚀", "nested": {"deep": [1, {"x": null}]}}']
INT_ARRAYS = ["{1,2}", "{}", "{7}", "{1,2,3,5,8}", "{NULL,4}", "{-1,0,1}"]
TEXT_ARRAYS = ['{"a b",c}', "{}", '{"with \\"quote\\"","back\\\\slash"}', '{NULL,"NULL"}', "{ä,😀}"]
DISCOUNTS = [None, 0.0, 0.05, 0.1, 0.125, 0.3333333333333333, 1e-07, 0.99]
SCORES = [None, 3.14159, -2.5, 1e-300, 6.02214076e23, 0.1, -0.0, 12345.6789, 1.7976931348623157e308]
BIG_INTS = [None, 0, -1, 9007199254740993, -9223372036854775808, 9223372036854775807]
PRECISE_NUMERICS = ["12345.678901234567890", "-0.000000000000000000001", "0", "99999999999999999999.99"]
DEPARTMENTS = ["Sales", "R&D", "Buchhaltung", "人事部", "Ops/Infra", "Legal \"L\""]

# Large values (tens of KB), used now and then for customers' notes: unchanged large values
# must not be repeated in UPDATE after-images.
_LARGE_UNIT = "Große Anmerkung — 大きなメモ — 🚀 \"quoted\", back\\slash; line\n"
LARGE_TEXTS = [_LARGE_UNIT * repeat for repeat in (250, 600, 1100)]

# Hostile transaction ids: a capture must never use an xid as a path or file name.
SINGLE_HOSTILE_XIDS = ["/", ".", "..", "\\"]  # each used once: xids must be unique
HOSTILE_XID_PATTERNS: list[Callable[[int], str]] = [
    lambda n: f"a/b/{n}",
    lambda n: f"../../etc/{n}",
    lambda n: f"..\\..\\{n}",
    lambda n: f"tx {n} . with spaces",
    lambda n: f"Überweisung-{n}-日本-🚀",
    lambda n: f"{n}.".ljust(MAX_XID_LENGTH, "ø"),
    lambda n: f"C:\\{n}\\x",
    lambda n: f"{n}e\u0301\u200b",
    lambda n: f"*?<>|:{n}",
    lambda n: f"${{HOME}}/{n}",
]

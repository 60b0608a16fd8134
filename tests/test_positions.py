import pytest

from trailbound.positions import Csn, LogPosition, Scn, TrailPosition


@pytest.mark.parametrize("value", [Scn(0), Scn(8440969), LogPosition(1, 47, 68748800), TrailPosition(3, 2142224),
                                   Csn(8440969, 2, 24, 65657408)])
def test_text_form_round_trips(value):
    assert type(value).parse(str(value)) == value


def test_csn_orders_by_commit_scn_then_commit_position():
    assert Csn(100, 2, 1, 0) < Csn(101, 1, 1, 0)
    assert Csn(100, 1, 9, 9) < Csn(100, 2, 1, 0)  # a tie on scn: thread, sequence, rba decide
    assert Csn(100, 1, 3, 5) < Csn(100, 1, 3, 6)


def test_bare_csn_sorts_before_every_commit_at_that_scn():
    assert Csn.parse("100") == Csn(100, 0, 0, 0)
    assert Csn.parse("100") < Csn(100, 1, 1, 0) < Csn.parse("101")


@pytest.mark.parametrize("text", ["", "x", "-1", "1:2", "1:2:3:4", "1.5"])
def test_log_position_rejects_malformed_text(text):
    with pytest.raises(ValueError, match="log position"):
        LogPosition.parse(text)


def test_positions_do_not_mix_with_plain_ints():
    with pytest.raises(TypeError):
        Scn(5) < 6  # noqa: B015 - the comparison itself must fail


def test_the_csn_order_in_columns_is_the_order_of_csn_values():
    import numpy as np

    from trailbound.positions import CSN_COLUMNS, TRAIL_ORDER, csn_at_or_below

    values = [Csn(100, 1, 1, 5), Csn(100, 1, 1, 6), Csn(100, 1, 2, 0), Csn(100, 2, 0, 0), Csn(99, 9, 9, 9),
              Csn(101, 0, 0, 0)]
    rows = [dict(zip(CSN_COLUMNS, v.key())) for v in values]
    assert [Csn.from_row(r) for r in rows] == values, "a row reads back as the CSN it was written from"
    assert TRAIL_ORDER[:4] == CSN_COLUMNS
    columns = [np.array([r[c] for r in rows]) for c in CSN_COLUMNS]
    for bound in values:
        assert list(csn_at_or_below(columns, bound)) == [v <= bound for v in values], bound


def test_a_forced_transaction_commits_at_the_horizon_after_every_real_commit_below_it():
    forced = Csn.forced(Scn(500), 3)
    assert str(forced) == "500@0:0:3" and Csn.parse(str(forced)) == forced
    assert Csn(499, 9, 9, 9) < Csn.forced(Scn(500), 0) < forced < Csn.forced(Scn(500), 4) < Csn(501)

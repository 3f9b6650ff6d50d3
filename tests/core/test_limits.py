"""The rate parser and the window arithmetic of per-key limits (core.limits), and the
transition table's part in exclusivity: a claim sets the key, every exit from WORKING
clears it."""

from __future__ import annotations

import re

import pytest

from dbworker.core.errors import ConfigurationError
from dbworker.core.limits import Rate, max_in_window, parse_rate, slot_free
from dbworker.core.status import Phase
from dbworker.core.transitions import KEY, NULL, ROWS, Transition


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("5/s", Rate(5, 1.0)),
        ("100/m", Rate(100, 60.0)),
        ("1/h", Rate(1, 3600.0)),
        (" 7 / s ", Rate(7, 1.0)),
    ],
)
def test_rates_parse(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert str(rate) == text.replace(" ", "")


@pytest.mark.parametrize("text", ["5", "5/d", "five/s", "5/sec", "-1/s", "1.5/s", "", "/s"])
def test_a_malformed_rate_is_refused_by_name(text: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(repr(text))):
        parse_rate(text)


def test_n_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match=r"'0/s'.*positive"):
        parse_rate("0/s")


def test_a_rate_must_be_a_string() -> None:
    with pytest.raises(ConfigurationError, match="5"):
        parse_rate(5)


def test_a_slot_is_free_a_window_after_its_use() -> None:
    rate = Rate(2, 1.0)
    assert slot_free(None, 100.0, rate)
    assert not slot_free(99.5, 100.0, rate)
    assert slot_free(99.0, 100.0, rate)


def test_max_in_window() -> None:
    assert max_in_window([], 1.0) == 0
    assert max_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    assert max_in_window([0.0, 1.0, 2.0], 1.0) == 1


def test_claims_hold_the_key_and_every_exit_from_working_frees_it() -> None:
    assert ROWS[Transition.CLAIM].sets["held_key"] is KEY
    assert ROWS[Transition.TAKEOVER].sets["held_key"] is KEY
    leaving = [
        row
        for row in ROWS.values()
        if Phase.WORKING in row.sources and row.target is not Phase.WORKING
    ]
    assert {row.transition for row in leaving} >= {
        Transition.FINISH,
        Transition.UNFINISH,
        Transition.FAIL,
        Transition.RETRY,
        Transition.RELEASE,
        Transition.CRASH,
        Transition.GIVE_UP,
        Transition.CANCEL,
    }
    for row in leaving:
        assert row.sets.get("held_key") is NULL, f"{row.transition} leaves WORKING keeping its key"
    # Staying WORKING keeps the key (a renewal); nothing else sets it.
    assert "held_key" not in ROWS[Transition.RENEW].sets
    for row in ROWS.values():
        if row.target is not Phase.WORKING:
            assert row.sets.get("held_key") in (None, NULL)

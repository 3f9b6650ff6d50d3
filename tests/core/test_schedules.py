"""Schedules: where slots fall (fixed intervals, cron in a timezone across daylight
saving time), and which missed slots each catch-up policy makes."""

from __future__ import annotations

import datetime as dt

import pytest

from dbworker.core.errors import ConfigurationError
from dbworker.core.schedules import (
    MAX_CATCH_UP,
    CatchUp,
    Schedule,
    from_microseconds,
    to_microseconds,
)

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "exactly one of cron= (a cron expression) or every="),
        ({"cron": "* * * * *", "every": dt.timedelta(seconds=1)}, "exactly one of"),
        ({"cron": "* * * *"}, "'* * * *'"),
        ({"cron": "0 0 * * * *"}, "five fields"),
        ({"cron": "61 * * * *"}, "'61 * * * *'"),
        ({"cron": "* * 31 2 *"}, "'* * 31 2 *'"),
        ({"cron": 5}, "5"),
        ({"every": dt.timedelta(0)}, "positive"),
        ({"every": dt.timedelta(seconds=-3)}, "positive"),
        ({"every": 5}, "timedelta, got 5"),
        ({"every": dt.timedelta(seconds=1), "timezone": "Mars/Olympus"}, "'Mars/Olympus'"),
        ({"every": dt.timedelta(seconds=1), "timezone": 1}, "timezone"),
        ({"every": dt.timedelta(seconds=1), "catch_up": "some"}, "'some'"),
    ],
)
def test_bad_input_is_refused_naming_the_value(arguments: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Schedule.of(**arguments)  # type: ignore[arg-type]
    assert named in str(raised.value)


# -- fixed intervals -------------------------------------------------------------------------


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch() -> None:
    every = Schedule.of(every=dt.timedelta(seconds=10))
    assert every.next_after(at("2026-01-01T00:00:03+00:00")) == at("2026-01-01T00:00:10+00:00")
    assert every.next_after(at("2026-01-01T00:00:10+00:00")) == at("2026-01-01T00:00:20+00:00")
    assert every.latest(at("2026-01-01T00:00:10+00:00")) == at("2026-01-01T00:00:10+00:00")
    assert every.slots(at("2026-01-01T00:00:10+00:00"), at("2026-01-01T00:00:40+00:00")) == [
        at("2026-01-01T00:00:20+00:00"),
        at("2026-01-01T00:00:30+00:00"),
        at("2026-01-01T00:00:40+00:00"),
    ]


def test_slots_round_trip_through_microseconds() -> None:
    slot = at("2026-03-29T01:30:00.25+00:00")
    assert from_microseconds(to_microseconds(slot)) == slot


# -- cron ------------------------------------------------------------------------------------


def test_cron_slots_in_a_timezone() -> None:
    berlin = Schedule.of(cron="0 9 * * MON-FRI", timezone="Europe/Berlin")
    # Friday 2026-01-09 at 09:00 in Berlin is 08:00 UTC; the next is Monday.
    assert berlin.next_after(at("2026-01-09T07:00:00+00:00")) == at("2026-01-09T08:00:00+00:00")
    assert berlin.next_after(at("2026-01-09T08:00:00+00:00")) == at("2026-01-12T08:00:00+00:00")
    assert berlin.latest(at("2026-01-11T12:00:00+00:00")) == at("2026-01-09T08:00:00+00:00")
    assert berlin.latest(at("2026-01-09T08:00:00+00:00")) == at("2026-01-09T08:00:00+00:00")


def test_a_slot_in_the_skipped_hour_runs_after_the_change() -> None:
    # On 2026-03-29 Berlin's clocks go from 02:00 to 03:00: 02:30 does not happen.
    nightly = Schedule.of(cron="30 2 * * *", timezone="Europe/Berlin")
    slots = nightly.slots(at("2026-03-27T12:00:00+00:00"), at("2026-03-30T12:00:00+00:00"))
    assert slots == [
        at("2026-03-28T02:30:00+01:00"),
        at("2026-03-29T03:00:00+02:00"),  # just after the change, once
        at("2026-03-30T02:30:00+02:00"),
    ]


def test_a_slot_in_the_repeated_hour_runs_once() -> None:
    # On 2026-10-25 Berlin's clocks go from 03:00 back to 02:00: 02:30 happens twice.
    nightly = Schedule.of(cron="30 2 * * *", timezone="Europe/Berlin")
    slots = nightly.slots(at("2026-10-24T12:00:00+00:00"), at("2026-10-25T12:00:00+00:00"))
    assert len(slots) == 1


# -- catching up -----------------------------------------------------------------------------

SECOND = dt.timedelta(seconds=1)
LAST = at("2026-01-01T00:00:00+00:00")
NOW = at("2026-01-01T00:00:05.5+00:00")


@pytest.mark.parametrize(
    ("policy", "made"),
    [
        (CatchUp.LATEST, [at("2026-01-01T00:00:05+00:00")]),
        (CatchUp.ALL, [at(f"2026-01-01T00:00:0{n}+00:00") for n in range(1, 6)]),
        (CatchUp.NONE, []),
    ],
)
def test_each_policy_makes_its_missed_slots(policy: CatchUp, made: list[dt.datetime]) -> None:
    schedule = Schedule.of(every=SECOND, catch_up=policy.value)
    assert schedule.missed(LAST, NOW) == (made, 0)


@pytest.mark.parametrize("policy", list(CatchUp))
def test_nothing_is_missed_before_the_first_tick_or_when_none_was_missed(policy: CatchUp) -> None:
    schedule = Schedule.of(every=SECOND, catch_up=policy.value)
    assert schedule.missed(None, NOW) == ([], 0)
    assert schedule.missed(at("2026-01-01T00:00:05+00:00"), NOW) == ([], 0)


def test_catching_up_all_is_bounded_to_the_most_recent_slots() -> None:
    schedule = Schedule.of(every=SECOND, catch_up="all")
    made, left_out = schedule.missed(LAST, LAST + dt.timedelta(days=7))
    assert len(made) == MAX_CATCH_UP
    assert made[-1] == LAST + dt.timedelta(days=7)
    assert made[0] == LAST + dt.timedelta(days=7) - (MAX_CATCH_UP - 1) * SECOND
    assert left_out == 7 * 86_400 - MAX_CATCH_UP


def test_catching_up_all_on_cron_says_some_were_left_out() -> None:
    schedule = Schedule.of(cron="* * * * *", catch_up="all")
    made, left_out = schedule.missed(LAST, LAST + dt.timedelta(days=2))
    assert len(made) == MAX_CATCH_UP and left_out >= 1

"""When discovery runs: before a claim when the known records ran short, and otherwise
at a bounded interval while claims come back full (so rows an ``eligible`` order puts
first do not wait for a whole backlog)."""

from __future__ import annotations

from dbworker.scheduling.discovery import BUSY_DISCOVERY_SECONDS, DiscoverySchedule


def test_the_first_poll_discovers() -> None:
    assert DiscoverySchedule().due(now=0.0)


def test_full_claims_put_discovery_off_for_the_busy_interval() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=100.0, poll_seconds=0.05)
    assert not schedule.due(100.0 + BUSY_DISCOVERY_SECONDS / 2)
    assert schedule.due(100.0 + BUSY_DISCOVERY_SECONDS)


def test_a_longer_poll_interval_is_kept_while_busy() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=0.0, poll_seconds=BUSY_DISCOVERY_SECONDS * 3)
    assert not schedule.due(BUSY_DISCOVERY_SECONDS * 2)
    assert schedule.due(BUSY_DISCOVERY_SECONDS * 3)


def test_a_short_claim_makes_discovery_due_at_once() -> None:
    schedule = DiscoverySchedule()
    schedule.claims_full(now=0.0, poll_seconds=0.05)
    schedule.ran_short(now=0.2)
    assert schedule.due(0.2)

"""The conformance suite on every built-in dialect, and on MySQL under both drivers."""

from __future__ import annotations

import functools

import pytest

from backends import as_pymysql
from dbworker.dialects import for_url

from . import checks
from .support import VARIANTS, DialectFactory

# The root conftest honours an explicit "backend" parametrization; this one adds the
# PyMySQL run of the same MySQL database.
pytestmark = pytest.mark.parametrize(
    ("backend", "driver"),
    [
        pytest.param("sqlite", None, id="sqlite"),
        pytest.param("postgresql", None, id="postgresql"),
        pytest.param("mysql", None, id="mysql"),
        pytest.param("mysql", "pymysql", id="mysql-pymysql"),
    ],
    indirect=["backend"],
)


@pytest.fixture
def url(database_url: str, driver: str | None) -> str:
    return as_pymysql(database_url) if driver == "pymysql" else database_url


@pytest.fixture
def make_dialect(url: str) -> DialectFactory:
    return functools.partial(for_url, url)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_racing_claims(make_dialect: DialectFactory, url: str, variant: str) -> None:
    checks.check_racing_claims(make_dialect, url, variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_claim_leaves_source_rows_unlocked(
    make_dialect: DialectFactory, url: str, variant: str
) -> None:
    checks.check_claim_leaves_source_rows_unlocked(make_dialect, url, variant)


def test_concurrent_discovery_hides_no_claimable_record(
    make_dialect: DialectFactory, url: str
) -> None:
    checks.check_concurrent_discovery_hides_no_claimable_record(make_dialect, url)


def test_takeover_after_lease_expiry(make_dialect: DialectFactory, url: str) -> None:
    checks.check_takeover_after_lease_expiry(make_dialect, url)


def test_stale_token_cannot_complete_or_renew(make_dialect: DialectFactory, url: str) -> None:
    checks.check_stale_token_cannot_complete_or_renew(make_dialect, url)


def test_completion_is_atomic(make_dialect: DialectFactory, url: str) -> None:
    checks.check_completion_is_atomic(make_dialect, url)


def test_terminal_records_never_claimed(make_dialect: DialectFactory, url: str) -> None:
    checks.check_terminal_records_never_claimed(make_dialect, url)


def test_reset_failed(make_dialect: DialectFactory, url: str) -> None:
    checks.check_reset_failed(make_dialect, url)


def test_unfinish_delay(make_dialect: DialectFactory, url: str) -> None:
    checks.check_unfinish_delay(make_dialect, url)


def test_fail_with_retry_delay(make_dialect: DialectFactory, url: str) -> None:
    checks.check_fail_with_retry_delay(make_dialect, url)


def test_release_counts_crashes(make_dialect: DialectFactory, url: str) -> None:
    checks.check_release_counts_crashes(make_dialect, url)


def test_status_condition_gates_dependent_claims(make_dialect: DialectFactory, url: str) -> None:
    checks.check_status_condition_gates_dependent_claims(make_dialect, url)


def test_batch_claims_follow_eligible_order(make_dialect: DialectFactory, url: str) -> None:
    checks.check_batch_claims_follow_eligible_order(make_dialect, url)


def test_discovers_later_inserts(make_dialect: DialectFactory, url: str) -> None:
    checks.check_discovers_later_inserts(make_dialect, url)


def test_discovery_reports_its_watermark(make_dialect: DialectFactory, url: str) -> None:
    checks.check_discovery_reports_its_watermark(make_dialect, url)


def test_discovery_leaves_source_rows_unlocked(make_dialect: DialectFactory, url: str) -> None:
    checks.check_discovery_leaves_source_rows_unlocked(make_dialect, url)


def test_sweep_finds_rows_below_watermark(make_dialect: DialectFactory, url: str) -> None:
    checks.check_sweep_finds_rows_below_watermark(make_dialect, url)


def test_out_of_order_commits_found_by_sweep(make_dialect: DialectFactory, url: str) -> None:
    checks.check_out_of_order_commits_found_by_sweep(make_dialect, url)


def test_non_integer_keys_discovered(make_dialect: DialectFactory, url: str) -> None:
    checks.check_non_integer_keys_discovered(make_dialect, url)


def test_read_state(make_dialect: DialectFactory, url: str) -> None:
    checks.check_read_state(make_dialect, url)

"""The conformance checks: plain functions ``check(make_dialect, url)``, by name.

``make_dialect`` is called with a fake clock and must return the dialect under test;
``url`` names a database the check may create its tables in. A check raises
AssertionError when the dialect breaks the contract, and ``NotApplicable`` when a
capability flag says the behaviour does not apply. Assertions never ask which database
this is: only the dialect's declared capabilities select what is checked.

The checks are ``assert`` statements, which ``python -O`` strips: ``run_check`` refuses
to run there rather than pass everything. Under pytest, ``pytest.register_assert_rewrite
("dbworker.testing")`` in a conftest (before the kit is imported) makes a failed
assertion show its values.

Claim cost independent of history is a benchmark (benchmarks/), not a check here.
"""

from __future__ import annotations

import functools

from ..harness import DialectFactory, drop_tables
from ..models import VARIANTS
from .cancelling import check_cancel_open_records, check_cancel_racing_finish
from .claiming import (
    check_batch_claims_follow_eligible_order,
    check_claim_leaves_source_rows_unlocked,
    check_concurrent_discovery_hides_no_claimable_record,
    check_racing_claims,
    check_status_condition_gates_dependent_claims,
)
from .common import Check
from .discovery import (
    check_discovers_later_inserts,
    check_discovery_leaves_source_rows_unlocked,
    check_discovery_reports_its_watermark,
    check_non_integer_keys_discovered,
    check_out_of_order_commits_found_by_sweep,
    check_sweep_finds_rows_below_watermark,
)
from .fencing import (
    check_autocommitted_finish_commits_alone,
    check_completion_is_atomic,
    check_finish_all_matches_current_tokens,
    check_stale_token_cannot_complete_or_renew,
    check_takeover_after_lease_expiry,
)
from .lifecycle import (
    check_fail_with_retry_delay,
    check_read_state,
    check_release_counts_crashes,
    check_reset_failed,
    check_terminal_records_never_claimed,
    check_unfinish_delay,
)
from .limits import (
    check_exclusive_claims_one_per_key,
    check_racing_claims_of_one_key,
    check_rate_limit_in_window,
    check_rate_limit_per_key,
)

__all__ = ["CHECKS", "Check", "check_names", "run_check"]

#: Every check by name; parametrized checks once per eligible-query variant.
CHECKS: dict[str, Check] = {
    **{
        f"racing_claims[{name}]": functools.partial(check_racing_claims, variant=name)
        for name in VARIANTS
    },
    **{
        f"racing_claims_on_scheduler_connections[{name}]": functools.partial(
            check_racing_claims, variant=name, scheduler=True
        )
        for name in VARIANTS
    },
    **{
        f"claim_leaves_source_rows_unlocked[{name}]": functools.partial(
            check_claim_leaves_source_rows_unlocked, variant=name
        )
        for name in VARIANTS
    },
    "concurrent_discovery_hides_no_claimable_record": (
        check_concurrent_discovery_hides_no_claimable_record
    ),
    "takeover_after_lease_expiry": check_takeover_after_lease_expiry,
    "stale_token_cannot_complete_or_renew": check_stale_token_cannot_complete_or_renew,
    "completion_is_atomic": check_completion_is_atomic,
    "finish_all_matches_current_tokens": check_finish_all_matches_current_tokens,
    "autocommitted_finish_commits_alone": check_autocommitted_finish_commits_alone,
    "terminal_records_never_claimed": check_terminal_records_never_claimed,
    "reset_failed": check_reset_failed,
    "unfinish_delay": check_unfinish_delay,
    "fail_with_retry_delay": check_fail_with_retry_delay,
    "release_counts_crashes": check_release_counts_crashes,
    "status_condition_gates_dependent_claims": check_status_condition_gates_dependent_claims,
    "batch_claims_follow_eligible_order": check_batch_claims_follow_eligible_order,
    "discovers_later_inserts": check_discovers_later_inserts,
    "discovery_reports_its_watermark": check_discovery_reports_its_watermark,
    "discovery_leaves_source_rows_unlocked": check_discovery_leaves_source_rows_unlocked,
    "sweep_finds_rows_below_watermark": check_sweep_finds_rows_below_watermark,
    "out_of_order_commits_found_by_sweep": check_out_of_order_commits_found_by_sweep,
    "non_integer_keys_discovered": check_non_integer_keys_discovered,
    "read_state": check_read_state,
    "cancel_open_records": check_cancel_open_records,
    "cancel_racing_finish": check_cancel_racing_finish,
    "exclusive_claims_one_per_key": check_exclusive_claims_one_per_key,
    "racing_claims_of_one_key": check_racing_claims_of_one_key,
    "rate_limit_in_window": check_rate_limit_in_window,
    "rate_limit_per_key": check_rate_limit_per_key,
}


def check_names() -> list[str]:
    """The names of every check, in the order ``exercise`` runs them."""
    return list(CHECKS)


def run_check(name: str, make_dialect: DialectFactory, url: str) -> None:
    """Run the check ``name`` against the dialect ``make_dialect`` makes, in the
    database ``url`` names (the tables an earlier check left there are dropped first).

    Raises what the check raises: AssertionError for a broken contract,
    ``NotApplicable`` for a check the dialect's flags rule out.
    """
    if not __debug__:
        raise RuntimeError("the conformance checks are assert statements: run without -O")
    check = CHECKS.get(name)
    if check is None:
        raise LookupError(f"no conformance check is named {name!r}: see check_names()")
    drop_tables(url)
    check(make_dialect, url)

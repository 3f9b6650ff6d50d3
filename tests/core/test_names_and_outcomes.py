"""Worker-name validation and the handler outcomes."""

from __future__ import annotations

import math

import pytest

from dbworker.core import ConfigurationError, Finished, Unfinished
from dbworker.core.names import LONGEST_SUFFIX, TABLE_PREFIX, table_name, validate_worker_name

# -- worker names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "process", "step_2", "a_b_c", "x9", "a__", "z" * 40])
def test_valid_names(name: str) -> None:
    assert validate_worker_name(name, 63) == name
    assert table_name(name) == f"dbworker_{name}"


BAD_NAMES = [
    "",
    "Process",
    "pROCESS",
    "1st",
    "_private",
    "with-dash",
    "with space",
    "dotted.name",
    "tab\t",
    "process\n",  # a trailing newline satisfies a careless `$`, not fullmatch
    "caf\u00e9",
    "\u0430bc",  # Cyrillic a
    "semi;colon",
    'quote"d',
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_names_outside_the_pattern_are_rejected(name: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        validate_worker_name(name, 63)
    message = str(raised.value)
    assert repr(name) in message
    assert "must start with a lowercase letter" in message
    assert "lowercase letters, digits and underscores" in message


@pytest.mark.parametrize("name", [None, 1, b"process", ["process"]], ids=repr)
def test_non_string_names_are_rejected(name: object) -> None:
    with pytest.raises(ConfigurationError, match="worker name must be a str"):
        validate_worker_name(name, 63)


@pytest.mark.parametrize("max_identifier", [63, 64, 30])
def test_name_length_limit_follows_the_database_identifier_limit(max_identifier: int) -> None:
    # The longest identifier derived from a name is "dbworker_<name>_status_ix".
    limit = max_identifier - len(TABLE_PREFIX) - len(LONGEST_SUFFIX)
    longest = "a" * limit
    assert validate_worker_name(longest, max_identifier) == longest
    assert len(f"{table_name(longest)}{LONGEST_SUFFIX}") == max_identifier
    with pytest.raises(ConfigurationError) as raised:
        validate_worker_name(longest + "a", max_identifier)
    assert "too long for this database's identifiers" in str(raised.value)
    assert f"at most {limit} characters" in str(raised.value)


def test_postgresql_limit_is_44_characters() -> None:
    validate_worker_name("a" * 44, 63)
    with pytest.raises(ConfigurationError, match="at most 44 characters"):
        validate_worker_name("a" * 45, 63)


# -- outcomes ------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 0.0, 1, 2.5, 86400])
def test_unfinished_accepts_finite_non_negative_delays(delay: float) -> None:
    assert Unfinished(delay).delay == delay


def test_unfinished_defaults_to_no_delay() -> None:
    assert Unfinished().delay == 0.0
    assert Unfinished() == Unfinished(0)


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf], ids=repr)
def test_unfinished_rejects_negative_or_infinite_delays(delay: float) -> None:
    with pytest.raises(ConfigurationError, match="must be a finite number >= 0"):
        Unfinished(delay)


@pytest.mark.parametrize("delay", ["1", None, True, False, [1]], ids=repr)
def test_unfinished_rejects_non_numbers(delay: object) -> None:
    with pytest.raises(ConfigurationError, match=r"Unfinished\(delay=...\) must be a number"):
        Unfinished(delay)  # type: ignore[arg-type]


def test_outcomes_are_immutable_values() -> None:
    assert Finished() == Finished()
    with pytest.raises(AttributeError):
        Unfinished(1).delay = 2  # type: ignore[misc]


def test_a_task_payload_is_unpickled_once_per_process() -> None:
    import pickle

    from dbworker.core import tasks

    payload = pickle.dumps((print, int, None, False))
    first = tasks.task_from_message((("w", 1, 1, 1, 0, None), payload))
    again = tasks.task_from_message((("w", 2, 1, 1, 0, None), payload))
    assert isinstance(first, tasks.Task) and isinstance(again, tasks.Task)
    assert (again.handler, again.source, again.source_id) == (print, int, 2)
    assert tasks._decoded[payload] == (print, int, None, False)


def test_a_payload_that_cannot_be_unpickled_is_reported_each_time() -> None:
    from dbworker.core import tasks

    broken = b"not a pickle"
    for _ in range(2):
        result = tasks.task_from_message((("w", 1, 1, 1, 0, None), broken))
        assert isinstance(result, tasks.Result)
        assert result.kind is tasks.ResultKind.UNRECORDED
    assert broken not in tasks._decoded

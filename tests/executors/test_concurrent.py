"""The executors that run many handlers at once in one process: ``Threads`` (sync
handlers) and ``AsyncIO`` (``async def`` handlers with an ``AsyncSession``), on every
database. The rest of the behaviour suite (``test_executors.py``) runs on threads too;
its crash table runs here on the event loop with the async handler.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from dbworker import (
    AsyncIO,
    ConfigurationError,
    Coordinator,
    Event,
    EventKind,
    ExecutionStatus,
    Pool,
    Threads,
)
from dbworker.executors import ExecutorChoice
from waiting import pid_alive, wait_until

from . import app, async_app, forked_app, test_executors
from .support import Rig, child_env

FINISHED = ExecutionStatus.FINISHED
FAILED = ExecutionStatus.FAILED
UNFINISHED = ExecutionStatus.UNFINISHED
WORKING = ExecutionStatus.WORKING
TIMEOUT = 1.5

MODES = ("threads", "asyncio")


def setup(mode: str, **options: Any) -> tuple[ExecutorChoice, Callable[..., Any]]:
    """The executor of ``mode`` and the handler it runs."""
    if mode == "threads":
        return Threads(**options), async_app.handle_sync
    return AsyncIO(**options), async_app.handle


@pytest.mark.parametrize("mode", MODES)
def test_many_handlers_run_at_once_in_one_process(rig: Rig, mode: str) -> None:
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=12, handler=handler)
    gated = rig.add(*["gate"] * 12)
    quick = rig.add(*["finish"] * 24)
    coordinator.start()
    pids = {rig.wait_run(item_id, 1) for item_id in gated}
    assert len(pids) == 1, "twelve handlers at once, in one process"
    [pid] = pids
    assert pid != os.getpid()
    # All twelve are held: nothing else starts until one ends.
    assert all(not rig.runs(item_id) for item_id in quick)
    for item_id in gated:
        rig.open_gate(item_id, 1)
    rig.wait_status(coordinator, gated + quick, FINISHED)
    committed = Counter(effect.item_id for effect in rig.effects())
    assert committed == Counter(gated + quick), "every write committed exactly once"
    assert {effect.pid for effect in rig.effects()} == {pid}


@pytest.mark.parametrize("mode", MODES)
def test_concurrency_is_split_over_processes(rig: Rig, mode: str) -> None:
    choice, handler = setup(mode, processes=2)
    coordinator = rig.coordinator(choice, concurrency=4, handler=handler)
    gated = rig.add(*["gate"] * 4)
    coordinator.start()
    pids = Counter(rig.wait_run(item_id, 1) for item_id in gated)
    assert sorted(pids.values()) == [2, 2], pids
    for item_id in gated:
        rig.open_gate(item_id, 1)
    rig.wait_status(coordinator, gated, FINISHED)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("mode", MODES)
def test_a_single_threaded_service_forks_its_handler_process(rig: Rig, mode: str) -> None:
    """Started from a single-threaded process, the handler process is forked from the
    coordinator and is its only process: no fork server, no resource tracker. The
    application's SIGTERM handler is not inherited; every call commits exactly once."""
    report = _forked_app(rig, mode)
    [handler] = report["tree"]
    assert handler["parent"] == report["coordinator"]
    assert handler["forked"], "forked from the coordinator, not a new interpreter"
    assert not handler["catches_sigterm"], "the application's SIGTERM handler was reset"
    assert sorted(report["effects"]) == sorted(str(n) for n in range(1, forked_app.CALLS + 1))
    assert {count for count, _ in report["effects"].values()} == {1}, "exactly once"
    assert {pid for _, pid in report["effects"].values()} == {handler["pid"]}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_single_threaded_service_forks_its_pool_processes(rig: Rig) -> None:
    """The process pool's first processes fork from a single-threaded coordinator too:
    its tree is the coordinator and its handler processes, no fork server and no
    resource tracker (those start only to replace a process). The application's SIGTERM
    handler is not inherited; every call commits exactly once."""
    report = _forked_app(rig, "pool")
    tree = report["tree"]
    assert len(tree) == forked_app.POOL_CONCURRENCY, tree
    for handler in tree:
        assert handler["parent"] == report["coordinator"]
        assert handler["forked"], "forked from the coordinator, not a new interpreter"
        assert not handler["catches_sigterm"], "the application's SIGTERM handler was reset"
    assert sorted(report["effects"]) == sorted(str(n) for n in range(1, forked_app.CALLS + 1))
    assert {count for count, _ in report["effects"].values()} == {1}, "exactly once"
    assert {pid for _, pid in report["effects"].values()} <= {h["pid"] for h in tree}
    # The application's engine, whose pooled connections the processes inherited: they
    # used sessions of their own, and the service's own connections outlived them.
    if rig.engine.dialect.name != "sqlite":
        assert report["handler_app_sessions"], "the handlers read through the app's engine"
        assert not set(report["handler_app_sessions"]) & set(report["app_sessions"])
        assert sorted(report["app_sessions_after"]) == sorted(report["app_sessions"])


def _forked_app(rig: Rig, mode: str) -> dict[str, Any]:
    found = subprocess.run(
        [sys.executable, "-m", "tests.executors.forked_app", rig.url, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        env=child_env(),
    )
    assert found.returncode == 0, found.stderr
    report: dict[str, Any] = json.loads(found.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_async_outcomes_are_recorded_with_their_writes(
    rig: Rig, loop: Literal["asyncio", "uvloop"]
) -> None:
    choice = AsyncIO(loop=loop)
    coordinator = rig.coordinator(choice, concurrency=4, handler=async_app.handle)
    ids = rig.add("finish", "unfinished;finish", "raise", "wrong", "commit")
    coordinator.start()
    rig.wait_status(coordinator, ids[:2], FINISHED)
    rig.wait_status(coordinator, ids[2:], FAILED)
    errors = {i: rig.state(coordinator, i) for i in ids[2:]}
    raised, wrong, committed = (errors[i] for i in ids[2:])
    assert raised is not None
    assert raised["error"] == f"RuntimeError: item {ids[2]} raised on purpose"
    assert wrong is not None and "returned 42" in (wrong["error"] or "")
    assert committed is not None and "do not commit" in (committed["error"] or "")
    # Unfinished() commits its writes too; a failure's writes roll back.
    assert Counter(e.item_id for e in rig.effects()) == Counter({ids[0]: 1, ids[1]: 2})
    assert {e.info["loop"].partition(".")[0] for e in rig.effects()} == {loop}


@pytest.mark.parametrize("mode", MODES)
def test_endings_waiting_on_a_lock_held_by_a_handler_waiting_to_end_all_commit(
    rig: Rig, mode: str
) -> None:
    """Endings take turns (``invocation/turns.py``: two at once); a wait for a turn is
    bounded. Two handlers take both turns and their endings' flushes wait on a row lock
    that a third handler holds, which then needs a turn to end and release it: it ends
    without one, and all three commit exactly once. (On SQLite the lock is the
    database's: the two wait for it before they end, and still all three commit.)"""
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=3, handler=handler)
    holder, *waiters = rig.add("lock+gate", "gate+touch", "gate+touch")
    coordinator.start()
    for item_id in (holder, *waiters):
        rig.wait_run(item_id, 1)
    rig.wait_locked(holder, 1)
    for item_id in waiters:
        rig.open_gate(item_id, 1)
    time.sleep(0.5)  # both waiters in their endings, waiting on the lock
    rig.open_gate(holder, 1)
    rig.wait_status(coordinator, [holder, *waiters], FINISHED)
    assert Counter(e.item_id for e in rig.effects()) == Counter([holder, *waiters])
    with rig.engine.connect() as conn:
        plan = conn.execute(select(app.Item.plan).where(app.Item.id == holder)).scalar_one()
    assert plan == "lock+gate+touched+touched"


@pytest.mark.parametrize("mode", MODES)
def test_handlers_past_their_timeout_are_ended_and_their_process_recycled(
    rig: Rig, mode: str
) -> None:
    # ``late`` ignores its cancel (threads cannot be cancelled at all) and would write
    # after LATE_SECONDS; ``hang`` waits for ever. With nothing else in flight, their
    # process is replaced (on the event loop, once the cancel went unanswered).
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=3, timeout=TIMEOUT, handler=handler)
    late, hung = rig.add("late", "hang")
    coordinator.start()
    late_pid = rig.wait_run(late, 1)
    rig.wait_status(coordinator, [late, hung], FAILED)
    for item_id in (late, hung):
        state = rig.state(coordinator, item_id)
        assert state is not None and state["error_type"] == "dbworker.HandlerTimeout"
        assert state["crashes"] == 0
    wait_until(lambda: not pid_alive(late_pid), "the stuck handlers' process to be replaced")
    [other] = rig.add("gate")
    assert rig.wait_run(other, 1) != late_pid
    rig.open_gate(other, 1)
    rig.wait_status(coordinator, [other], FINISHED)
    time.sleep(async_app.LATE_SECONDS)
    assert [e.item_id for e in rig.effects()] == [other]


def test_a_timeout_cancels_only_that_task_on_the_event_loop(rig: Rig) -> None:
    coordinator = rig.coordinator(
        "asyncio", concurrency=3, timeout=TIMEOUT, handler=async_app.handle
    )
    hung, quick = rig.add("hang", "sleep")
    coordinator.start()
    pid = rig.wait_run(hung, 1)
    rig.wait_status(coordinator, [quick], FINISHED)
    rig.wait_status(coordinator, [hung], FAILED)
    [other] = rig.add("finish")
    rig.wait_status(coordinator, [other], FINISHED)
    # Cancelled, not killed: the same process ran on.
    assert {e.pid for e in rig.effects()} == {pid}
    assert sorted(e.item_id for e in rig.effects()) == [quick, other]


@pytest.mark.parametrize("mode", MODES)
def test_stop_with_a_deadline_releases_every_handler_in_flight(rig: Rig, mode: str) -> None:
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=5, handler=handler)
    ids = rig.add(*["hang"] * 5)
    coordinator.start()
    pids = {rig.wait_run(item_id, 1) for item_id in ids}
    coordinator.stop(timeout=0.5)
    assert {rig.status(coordinator, i) for i in ids} == {UNFINISHED}
    assert rig.effects() == []
    assert not any(pid_alive(pid) for pid in pids)


@pytest.mark.parametrize("mode", MODES)
def test_stop_without_a_deadline_waits_for_handlers_in_flight(rig: Rig, mode: str) -> None:
    choice, handler = setup(mode)
    coordinator = rig.coordinator(choice, concurrency=5, handler=handler)
    ids = rig.add(*["gate"] * 5)
    coordinator.start()
    for item_id in ids:
        rig.wait_run(item_id, 1)

    def open_later() -> None:
        for item_id in ids:
            rig.open_gate(item_id, 1)

    opener = threading.Timer(0.5, open_later)
    opener.start()
    coordinator.stop()
    opener.join()
    assert {rig.status(coordinator, i) for i in ids} == {FINISHED}
    assert Counter(e.item_id for e in rig.effects()) == Counter(ids)


def test_a_handler_blocking_the_event_loop_is_reported(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dbworker")
    coordinator = rig.coordinator("asyncio", concurrency=2, handler=async_app.handle)
    lags: list[Event] = []
    coordinator.events.subscribe(lambda e: lags.append(e) if e.kind is EventKind.LOOP_LAG else 0)
    ids = rig.add("block", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)
    wait_until(lambda: lags, "a loop_lag event")
    assert lags[0].worker == app.WORKER
    assert lags[0].duration is not None and lags[0].duration >= async_app.BLOCK_SECONDS / 2
    assert any("blocked the event loop" in r.getMessage() for r in caplog.records)


def test_drain_runs_async_handlers(rig: Rig) -> None:
    coordinator = rig.coordinator("asyncio", handler=async_app.handle)
    ids = rig.add("finish", "unfinished;finish", "raise")
    report = coordinator.drain()
    outcomes = Counter(item.outcome for item in report.items)
    assert outcomes == Counter({"finished": 2, "unfinished": 1, "failed": 1})
    assert Counter(e.item_id for e in rig.effects()) == Counter({ids[0]: 1, ids[1]: 2})


# -- the crash table on the event loop ----------------------------------------------------


def async_crash_params() -> list[Any]:
    return [
        pytest.param(case, id=f"asyncio-{case.id}")
        for case in test_executors.CRASHES
        if case.handler is app.handle  # the others are sync handlers of their own
    ]


@pytest.mark.parametrize("case", async_crash_params())
def test_async_crash_table(rig: Rig, case: test_executors.Crash) -> None:
    test_executors.test_crash_table(
        rig, "asyncio", dataclasses.replace(case, handler=async_app.handle)
    )


# -- choosing the executor ----------------------------------------------------------------


def registered(tmp_path: Path, handler: Any, **options: Any) -> Coordinator:
    url = f"sqlite:///{tmp_path / 'choice.sqlite'}"
    coordinator = Coordinator(
        sessionmaker(create_engine(url)),
        database_url=url,
        **({"executor": options.pop("default")} if "default" in options else {}),
    )
    coordinator.transactional_worker(name="job", source=app.Item, **options)(handler)
    return coordinator


def test_an_async_handler_gets_the_asyncio_executor_by_default(tmp_path: Path) -> None:
    assert registered(tmp_path, async_app.handle).workers["job"].executor == AsyncIO()
    assert registered(tmp_path, app.handle).workers["job"].executor == Pool()
    # A coordinator-wide choice applies to the handlers it can run.
    coordinator = registered(tmp_path, app.handle, default="asyncio")
    assert coordinator.workers["job"].executor == Pool()
    coordinator = registered(tmp_path, async_app.handle, default=AsyncIO(processes=2))
    assert coordinator.workers["job"].executor == AsyncIO(processes=2)
    assert registered(tmp_path, app.handle, executor="threads").workers["job"].executor == (
        Threads()
    )


@pytest.mark.parametrize("executor", ["pool", "spawn", "subprocess", "inline", "threads"])
def test_an_async_handler_with_a_sync_executor_is_refused(tmp_path: Path, executor: str) -> None:
    with pytest.raises(ConfigurationError, match='executor="asyncio"'):
        registered(tmp_path, async_app.handle, executor=executor)


def test_a_sync_handler_with_the_asyncio_executor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="define it with async def"):
        registered(tmp_path, app.handle, executor="asyncio")
    with pytest.raises(ConfigurationError, match="async generator"):
        registered(tmp_path, async_app.not_a_handler)


def test_a_missing_async_driver_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiosqlite", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'dbworker\[async\]'"):
        registered(tmp_path, async_app.handle)
    with pytest.raises(ConfigurationError, match="no asyncio driver"):
        registered(tmp_path, async_app.handle, executor=AsyncIO(driver="nosuchdriver"))


@pytest.mark.parametrize(
    "options",
    [{"processes": 0}, {"lag_warning": 0}, {"driver": ""}, {"loop": "trio"}],
    ids=["processes", "lag_warning", "driver", "loop"],
)
def test_asyncio_options_are_checked(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        AsyncIO(**options)


def test_a_missing_event_loop_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'dbworker\[uvloop\]'"):
        AsyncIO(loop="uvloop")


def test_threads_options_are_checked() -> None:
    with pytest.raises(ConfigurationError):
        Threads(threads=0)
    with pytest.raises(ConfigurationError):
        Threads(processes=True)

"""Conformance checks of discovery: later inserts, the watermark, rows committed out of
key order, keys that do not grow, and no lock on the application's rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from ...core.status import Phase
from ...dialects import WorkerTable
from ..harness import DialectFactory, Harness, ids
from ..models import ITEMS, KEYED_WORKER, Item, Keyed, by_id, key
from ..report import NotApplicable
from .common import note_of, skip_with_one_writer, status_of, without_waiting


def _known(h: Harness, worker: WorkerTable) -> set[Any]:
    return set(h.records(worker))


def check_discovers_later_inserts(make_dialect: DialectFactory, url: str) -> None:
    """Rows inserted after a discovery round are found by the next one."""
    with Harness(make_dialect, url) as h:
        h.seed(items=())
        h.add_items(1, 2, 3)
        h.discover(h.items)
        assert _known(h, h.items) == {1, 2, 3}
        h.add_items(4, 5)
        h.discover(h.items)
        assert _known(h, h.items) == {1, 2, 3, 4, 5}, "rows inserted later were not discovered"
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 3, 4, 5]


def check_discovery_reports_its_watermark(make_dialect: DialectFactory, url: str) -> None:
    """``discover_to_watermark`` adds what ``discover`` adds and returns the largest
    key known after it (what the coordinator's later sweeps start from)."""
    with Harness(make_dialect, url) as h:
        h.seed(items=())

        def discover() -> tuple[int, Any]:
            with h.admin.begin():
                return h.dialect.discover_to_watermark(h.admin, h.items)

        assert discover() == (0, None)
        h.add_items(1, 2, 3)
        assert discover() == (3, 3)
        assert discover() == (0, 3)
        h.add_items(7)
        assert discover() == (1, 7), "the watermark must follow the keys discovery added"
        assert _known(h, h.items) == {1, 2, 3, 7}


def check_discovery_leaves_source_rows_unlocked(make_dialect: DialectFactory, url: str) -> None:
    """While a discovery's transaction is open, the application can update the rows it
    found and insert rows above them without waiting."""
    with Harness(make_dialect, url) as h:
        skip_with_one_writer(h, "discovery")
        h.seed()
        a, app = h.actor(), h.app()
        newest = max(row.id for row in ITEMS)
        with a.begin():
            assert h.dialect.discover(a, h.items) == len(ITEMS)

            def touch() -> None:
                with app.begin():
                    app.execute(update(Item).values(note="app"))
                    h.add_items(newest + 1, conn=app)

            without_waiting("an application write of discovered rows during a discovery", touch)
        assert [note_of(h, row.id) for row in ITEMS] == ["app"] * len(ITEMS)
        assert _known(h, h.items) == {row.id for row in ITEMS}


def check_sweep_finds_rows_below_watermark(make_dialect: DialectFactory, url: str) -> None:
    """Rows whose keys sit below ones already discovered are found by ``sweep``.

    ``discover`` alone may miss them (it is allowed to look only above the largest
    known key), so nothing is asserted about it.
    """
    with Harness(make_dialect, url) as h:
        h.seed(items=())
        h.add_items(1, 2, 10)
        h.discover(h.items)
        h.add_items(5)
        h.discover(h.items)  # may or may not see 5
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 5, 10}, "sweep missed a row below the watermark"
        h.add_items(4, 7)
        h.sweep(h.items, above=5)
        assert 7 in _known(h, h.items), "sweep(above=5) must find key 7"
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 4, 5, 7, 10}
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 4, 5, 7, 10]


def check_out_of_order_commits_found_by_sweep(make_dialect: DialectFactory, url: str) -> None:
    """An insert that commits after a larger key was discovered is found by ``sweep``.

    ``discover`` alone may miss it: by the time key 5 is visible, the watermark is
    already 6. That is allowed, so nothing is asserted about it.
    """
    with Harness(make_dialect, url) as h:
        if not h.dialect.supports_concurrent_claims:
            raise NotApplicable(
                "a database without concurrent claims has one writer at a time, so inserts "
                "commit in the order they are made (check_sweep_finds_rows_below_watermark "
                "covers keys below the watermark)"
            )
        h.seed(items=())
        h.add_items(1, 2, 3, 4)
        h.discover(h.items)
        late, early = h.app(), h.app()
        with late.begin():
            h.add_items(5, conn=late)
            with early.begin():
                h.add_items(6, conn=early)
            without_waiting("discovery beside an open insert", lambda: h.discover(h.items))
            assert 6 in _known(h, h.items)
        h.discover(h.items)  # may or may not see 5
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 3, 4, 5, 6}, "sweep missed the late commit"
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 3, 4, 5, 6]


def check_non_integer_keys_discovered(make_dialect: DialectFactory, url: str) -> None:
    """Sources with non-integer keys (UUID strings) are discovered and claimable."""
    with Harness(make_dialect, url, workers=(KEYED_WORKER,)) as h:
        h.seed(items=())
        first = [key(f"first-{i}") for i in range(3)]
        h.add_keyed(*first)
        h.discover(h.keyed)
        assert _known(h, h.keyed) == set(first)
        later = [key(f"later-{i}") for i in range(3)]
        # Random keys do not grow with inserts: some later key sorts below an earlier one,
        # which a watermark (largest known key) would never find.
        assert min(later) < max(first)
        h.add_keyed(*later)
        h.discover(h.keyed)
        everything = sorted(first + later)
        assert _known(h, h.keyed) == set(everything), "non-integer keys inserted later missed"
        query = select(Keyed).order_by(Keyed.id)
        claims = h.claim(h.actor(), h.keyed, query, 10)
        assert ids(claims) == everything
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.keyed, claims[0].source_id, claims[0].token)
        assert status_of(h, h.keyed, claims[0].source_id) == Phase.FINISHED.value

"""A guided run of dbworker on an embedded SQLite file: ``python -m dbworker.demo``.

No server is needed. The demo builds a small application (a ``documents`` table),
registers two workers on it and lets them do real work in child processes:

* ``summarize`` reads a document one paragraph per invocation, committing its
  progress with ``Unfinished()`` until the last paragraph, then ``Finished()``.
  One document contains a paragraph the handler cannot read, so it ends FAILED.
* ``publish`` writes one row to ``publications`` per document, but only for
  documents whose ``summarize`` execution is FINISHED: its ``eligible`` query uses
  ``coordinator.has_execution_status``.

Half of the documents exist before ``start()``; the rest are inserted while the
workers run, and are picked up without any enqueue call. Once everything settles
the demo repairs the broken document, calls ``reset_failed()`` and watches both
workers complete it. Finally it stops the coordinator, prints a summary per worker
and status, and checks the application's own tables: every document summarized
once and published exactly once.

The exit status is 0 when those checks pass. ``--help`` lists the options (number
of documents, concurrency, database file, ...).

The models and handlers live in ``dbworker.demo.app``, an importable module, because
the worker processes import it to find them; ``python -m dbworker.demo`` runs
``dbworker.demo.__main__``, which multiprocessing never runs again in its children.
"""

from .run import main

__all__ = ["main"]

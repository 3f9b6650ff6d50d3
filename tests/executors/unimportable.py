"""A handler whose module imports in the test's process and nowhere else.

The suite's conftest (which no handler process imports) records the test process's
pid in the environment; every other process inherits the variable with a pid that
is not its own. That covers pool and spawn children, subprocess children, and the
fork server too: a coordinator asks it to preload handler modules, and it must not
hand children a module they could not import themselves.
"""

from __future__ import annotations

import os

from sqlalchemy.orm import Session

from dbworker import Finished

from .app import IMPORTER_PID_ENV, Item

if os.environ.get(IMPORTER_PID_ENV) != str(os.getpid()):
    raise ImportError("this module refuses to be imported in a handler process")


def handle(source: Item, session: Session) -> Finished:
    return Finished()

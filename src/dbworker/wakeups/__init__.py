"""Wake-ups: a committed write tells the coordinators serving a worker to look now.

Polling stays the safety net: a wake-up only moves a worker's next poll forward, so a
lost, late or spurious one costs latency or one query, never work.

- ``targets``: which tables each worker's ``eligible`` reads, and which workers wait
  on another's execution table (dependents).
- ``hook``: ORM events on the application's session factory that announce commits.
- ``local``: a same-host channel (Unix datagram sockets) that needs no server.
- ``postgresql``: NOTIFY in the writer's transaction and the coordinator's listener.
- ``service``: what a running coordinator starts, stops and announces.
"""

from .hook import SessionHook
from .postgresql import trigger_ddl
from .service import Wakeups
from .targets import Watched, watched

__all__ = ["SessionHook", "Wakeups", "Watched", "trigger_ddl", "watched"]

"""The web dashboard (the ``dbworker[dashboard]`` extra): ``dbworker dashboard APP``.

Server-rendered pages (Starlette and Jinja2, no JavaScript): the workers with their
counts and backlog, the throughput of the last hour, the live coordinators, the failed
items with their errors and tracebacks, and one record's history. Two actions, both
POST only: retry one failed item, retry all failed items of a worker.

Safe by default: it binds 127.0.0.1, and any other address requires an access token;
requests must name a local host (or the bound address) in ``Host``, which defeats
DNS rebinding; every POST carries a CSRF token and a cross-site POST (by ``Origin``
or ``Sec-Fetch-Site``) is refused; ``read_only`` removes the actions.
"""

from __future__ import annotations

from .app import LOOPBACK, check_binding, create_app, serve

__all__ = ["LOOPBACK", "check_binding", "create_app", "serve"]

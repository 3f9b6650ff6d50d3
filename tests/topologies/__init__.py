"""Production topologies the tests build themselves: PgBouncer, a PostgreSQL primary with
a streaming replica, a MariaDB Galera cluster (``DBWORKER_REQUIRE_BACKENDS``: see
``backends.py``). Run them alone with ``pytest -m topology``."""

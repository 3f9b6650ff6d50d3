"""What operators run, built on the operator API (``coordinator.operations``): the
``dbworker`` command (``cli``), the web dashboard (``dashboard``, the
``dbworker[dashboard]`` extra) and the Prometheus metrics (``metrics``, the
``dbworker[prometheus]`` extra), with how they show figures and records
(``display``).

Nothing in the coordinator depends on this package: it only reads and steers
through the API, never the coordinator's internals (``tests/test_layering.py``).
"""

"""The dialect conformance suite: one set of checks, run live against every dialect.

The checks in ``checks.py`` are plain functions taking a dialect factory (anything
callable as ``factory(clock) -> Dialect``, e.g. a ``Dialect`` subclass) and a database
URL. ``test_conformance.py`` runs them on the built-in dialects; ``test_broken.py``
runs them on deliberately broken dialects to prove they can fail.

A third-party dialect runs the same suite by parametrizing with its own class and an
empty database::

    import pytest
    from dialects.checks import CHECKS  # tests/ on sys.path, as pytest sets it up

    @pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
    def test_conformance(check, empty_database_url):
        check(MyDialect, empty_database_url)

A dialect must be registered (``dbworker.dialects.register`` or the entry point) for
the URL, because the checks build their worker tables through ``Coordinator``.
"""

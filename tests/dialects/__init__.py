"""The dialect conformance suite: the kit's checks (``dbworker.testing``), run live
against every dialect.

``test_conformance.py`` runs every check on the built-in dialects; ``test_broken.py``
runs them on deliberately broken dialects (``broken.py``) to prove they can fail;
``test_kit_example.py`` is the third-party example of docs/databases.md. The other
modules test what is particular to one dialect or one mechanism: claim plans, the
clock, the driver's cursor, idle connections, statement reuse.
"""

"""Assertion rewriting for the check modules, so a failed check explains itself."""

import pytest

pytest.register_assert_rewrite(f"{__package__}.checks", f"{__package__}.support")

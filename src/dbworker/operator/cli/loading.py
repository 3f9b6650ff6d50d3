"""Finding the application's coordinator from ``module:attribute``, and the exit
statuses of the command."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ...coordinator import Coordinator
from ...core.errors import DBWorkerError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

#: The environment variable naming the coordinator when the command line does not.
APP_ENV = "DBWORKER_APP"


class UsageError(DBWorkerError):
    """The command line is wrong (exit status 2)."""


class AppImportError(DBWorkerError):
    """Importing the application's module raised (its own error, not a bad reference)."""

    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.module = module


def load_coordinator(reference: str) -> Coordinator:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"expected module:attribute, got {reference!r}")
    sys.path.insert(0, ".")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module named by the reference is a bad reference; a module
        # that the application itself fails to import is the application's error.
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(f"cannot import {module_name!r}: {exc}") from None
        raise AppImportError(module_name) from exc
    except Exception as exc:
        raise AppImportError(module_name) from exc
    finally:
        sys.path.remove(".")
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{module_name} has no attribute {attribute!r}") from None
    if not isinstance(target, Coordinator):
        raise UsageError(f"{reference} is a {type(target).__name__}, not a dbworker Coordinator")
    return target

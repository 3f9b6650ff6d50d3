"""Every error dbworker raises derives from DBWorkerError."""

from __future__ import annotations


class DBWorkerError(Exception):
    """Base class of dbworker's own errors."""


class ConfigurationError(DBWorkerError, ValueError):
    """Bad input to the public API, reported at the earliest moment it can be seen."""


class UnknownWorkerError(DBWorkerError, KeyError):
    """A worker name that no ``transactional_worker`` registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class InvalidTransition(DBWorkerError):
    """An event that the execution state machine does not allow from the current status."""


class StaleToken(InvalidTransition):
    """A fenced event carried a token that is no longer the record's current one:
    the caller lost its claim (it expired and another holder took over)."""


class HandlerContractError(DBWorkerError, TypeError):
    """A handler broke its contract: wrong return type, or it committed or closed
    the session dbworker owns."""


class WorkerCrashed(DBWorkerError):
    """The process running a handler died before reporting an outcome."""


class HandlerTimeout(DBWorkerError):
    """A handler ran longer than its worker's ``timeout`` and was killed."""


class Cancelled(DBWorkerError):
    """The item was cancelled (``Coordinator.cancel``): its record is FAILED with this
    error type (``dbworker.Cancelled``) until ``reset_failed``, and a handler that was
    running it was stopped, its transaction rolled back."""


class HelperProcessError(DBWorkerError):
    """A process dbworker needs to start its handler processes (multiprocessing's fork
    server) kept dying: the service cannot run handlers. One line, for a supervisor."""


class ClaimContention(DBWorkerError):
    """A claim lost a race to a concurrent claim (two took the same free key of an
    ``exclusive_by`` worker at once) where the database lost the transaction with it:
    nothing was claimed, and claiming again in a moment is the remedy."""

"""Per-database strategies behind one interface, and the registry that picks one."""

from ..core.tasks import ErrorInfo
from .base import Dialect
from .interface import DialectInterface
from .registry import ENTRY_POINT_GROUP, dialect_class, for_engine, for_url, register
from .terms import Claim, Claims, Clock, Limits, Owner, WorkerTable

__all__ = [
    "ENTRY_POINT_GROUP",
    "Claim",
    "Claims",
    "Clock",
    "Dialect",
    "DialectInterface",
    "ErrorInfo",
    "Limits",
    "Owner",
    "WorkerTable",
    "dialect_class",
    "for_engine",
    "for_url",
    "register",
]

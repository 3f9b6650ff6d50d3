"""Per-database strategies behind one interface, and the registry that picks one."""

from ..core.tasks import ErrorInfo
from .base import Claim, Claims, Dialect, Owner
from .registry import ENTRY_POINT_GROUP, dialect_class, for_engine, for_url, register
from .terms import Clock, WorkerTable

__all__ = [
    "ENTRY_POINT_GROUP",
    "Claim",
    "Claims",
    "Clock",
    "Dialect",
    "ErrorInfo",
    "Owner",
    "WorkerTable",
    "dialect_class",
    "for_engine",
    "for_url",
    "register",
]

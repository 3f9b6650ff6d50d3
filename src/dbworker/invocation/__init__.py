"""What runs in a handler process: the runtime and handler session, the runner the
executors start in each process, and the connections a template lends.

Depends on core and dialects; executors never import it (the coordinator hands them
a ``ProcessRunner``).
"""

from .runner import ProcessRunner
from .runtime import ChildConfig, Runtime
from .session import HandlerSession

__all__ = ["ChildConfig", "HandlerSession", "ProcessRunner", "Runtime"]

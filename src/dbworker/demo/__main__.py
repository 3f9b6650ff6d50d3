"""``python -m dbworker.demo``: see ``dbworker.demo``."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())

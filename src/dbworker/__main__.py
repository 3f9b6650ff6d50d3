import sys

from .operator.cli import main

sys.exit(main())

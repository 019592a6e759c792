"""``python3 -m pgqueue``: see :mod:`pgqueue.cli`."""

import sys

from .cli import main

sys.exit(main())

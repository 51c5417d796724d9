"""``python -m hami_jupyter``: the same as the ``hami-jupyter`` command."""

import sys

from .commands.cli import main

sys.exit(main())

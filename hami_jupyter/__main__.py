"""``python -m hami_jupyter``: the same as the ``hami-jupyter`` command."""

import sys

from .cli import main

sys.exit(main())

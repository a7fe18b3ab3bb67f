"""``python -m rdmaxfer``: the same as the ``rdmaxfer`` command."""

import sys

from .tools.cli import main

sys.exit(main())

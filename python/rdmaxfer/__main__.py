"""``python -m rdmaxfer``: the same as the ``rdmaxfer`` command."""

import sys

from .cli import main

sys.exit(main())

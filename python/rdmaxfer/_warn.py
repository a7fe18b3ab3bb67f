"""Warnings that point at the user's line (private).

``warnings.warn(stacklevel=N)`` needs the depth of the caller, which differs by path
(``Engine.listen`` called by the user, or by ``WeightServer`` on the user's behalf; a fetch
coroutine run by ``asyncio.run``). :func:`warn` walks out of rdmaxfer's own frames, and out
of asyncio's, which run rdmaxfer's coroutines, to the first frame of the caller's code.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO = os.sep + "asyncio" + os.sep


def _internal(filename: str) -> bool:
    return filename.startswith(_PACKAGE) or _ASYNCIO in filename


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside rdmaxfer
    and asyncio (the top of the stack when there is none, e.g. in a worker thread)."""
    frame = sys._getframe(0)
    level = 1
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)

"""Dtype names (private): NumPy's, and the extension types of ``ml_dtypes`` (bfloat16, the
float8, float6 and float4 formats, int2/int4...), which is loaded only when one of its types
is named. ``import ml_dtypes`` takes longer than the rest of ``import rdmaxfer`` together, and
a program that moves only NumPy's own dtypes never needs it."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["ML_NAMES", "ml_dtypes_by_name", "parse_dtype"]

#: The ml_dtypes types a message's metadata may name (those the installed version has).
ML_NAMES = (
    "bfloat16",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "int2",
    "int4",
    "uint2",
    "uint4",
)


@functools.cache
def ml_dtypes_by_name() -> dict[str, np.dtype[np.generic]]:
    """``{name: dtype}`` for the names of :data:`ML_NAMES` the installed ml_dtypes has
    (imports ml_dtypes on the first call)."""
    import ml_dtypes

    return {
        name: np.dtype(getattr(ml_dtypes, name)) for name in ML_NAMES if hasattr(ml_dtypes, name)
    }


def parse_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    """``np.dtype(dtype)``, where an ml_dtypes name (``"bfloat16"``, ``"float8_e4m3fn"``...)
    works as it does once ml_dtypes is imported (it registers its names with NumPy).

    Raises:
        TypeError: NumPy and ml_dtypes know no such type (NumPy's message).
    """
    try:
        return np.dtype(dtype)
    except TypeError:
        if not isinstance(dtype, str) or "ml_dtypes" in sys.modules:
            raise
    ml_dtypes_by_name()
    return np.dtype(dtype)

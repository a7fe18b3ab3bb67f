"""Dtype names (private): NumPy's, and the extension types of ``ml_dtypes`` (bfloat16, the
float8, float6 and float4 formats, int2/int4...), which is loaded only when one of its types
is named. ``import ml_dtypes`` takes longer than the rest of ``import rdmaxfer`` together, and
a program that moves only NumPy's own dtypes never needs it."""

from __future__ import annotations

import functools
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["ML_NAMES", "DtypeTable", "ml_dtypes_by_name", "parse_dtype"]

K = TypeVar("K", bound=Hashable)

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


class DtypeTable(Mapping[K, "np.dtype[Any]"], Generic[K]):
    """A read-only ``{key: dtype}`` table (a wire format's dtype names or codes) whose
    ml_dtypes entries are given by their ml_dtypes name: ml_dtypes is imported on the first
    lookup of one of those keys, never for NumPy's own types. An ml_dtypes name the installed
    version lacks is not in the table.

    Args:
        entries: ``(key, dtype)`` pairs in their documented order, the dtype a NumPy dtype or
            the name of an ml_dtypes type (one of :data:`ML_NAMES`).
    """

    def __init__(self, entries: Sequence[tuple[K, np.dtype[Any] | str]]) -> None:
        self._numpy = {k: v for k, v in entries if not isinstance(v, str)}
        self._ml = {k: v for k, v in entries if isinstance(v, str)}
        self._order = [k for k, _ in entries]

    def __getitem__(self, key: K) -> np.dtype[Any]:
        if key in self._numpy:
            return self._numpy[key]
        return ml_dtypes_by_name()[self._ml[key]]

    def __contains__(self, key: object) -> bool:
        if key in self._numpy:
            return True
        return key in self._ml and self._ml[key] in ml_dtypes_by_name()

    def __iter__(self) -> Iterator[K]:
        return (k for k in self._order if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def key_of(self, dtype: npt.DTypeLike) -> K | None:
        """The key of ``dtype`` (None: not in the table). The ml_dtypes entries are looked at
        only when ml_dtypes is already imported: no array of its types exists before."""
        want = np.dtype(dtype)
        for key, known in self._numpy.items():
            if known == want:
                return key
        if "ml_dtypes" in sys.modules:
            by_name = ml_dtypes_by_name()
            for key, name in self._ml.items():
                if by_name.get(name) == want:
                    return key
        return None

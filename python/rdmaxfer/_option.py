"""One row of a settings table (:mod:`rdmaxfer.options`): its type, default, range,
environment variable and help, and how a value or the variable's text is checked and parsed."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["Option"]

_OFF = ("0", "off", "no", "false")
_ON = ("1", "on", "yes", "true")


class Option:
    """One setting: ``name`` (the options field, or the row's name when environment-only),
    ``kind`` ("int", "float", "bool", "str", "choice", "names" or "secret"), ``default``,
    ``env`` (its environment variable, or None), ``help``, ``unit`` ("" when none), an
    inclusive range ``low``..``high`` for numbers, ``choices`` for "choice", ``field``
    (False: environment-only) and ``read_by`` ("python" or "core": who reads the variable)."""

    __slots__ = (
        "choices", "default", "env", "field", "help", "high", "kind", "low", "name", "read_by",
        "unit",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        kind: str,
        default: Any,
        env: str | None,
        help: str,
        *,
        unit: str = "",
        low: float | None = None,
        high: float | None = None,
        choices: tuple[str, ...] = (),
        field: bool = True,
        read_by: str = "python",
    ) -> None:
        self.name, self.kind, self.default, self.env, self.help = name, kind, default, env, help
        self.unit, self.low, self.high, self.choices = unit, low, high, choices
        self.field, self.read_by = field, read_by

    def __repr__(self) -> str:
        return f"Option({self.name!r}, env={self.env!r}, default={self.default!r})"

    def expects(self) -> str:
        """What a valid value is, in words (used in error messages)."""
        if self.kind == "choice":
            return " or ".join(repr(c) for c in self.choices)
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            low, high = (
                (None if b is None else int(b) if self.kind == "int" else f"{b:g}")
                for b in (self.low, self.high)
            )
            if low is not None and high is not None:
                return f"{what} in {low}..{high}"
            return f"{what} >= {low}" if low is not None else what
        if self.kind == "bool":
            return "True or False (in the environment: 1/0, on/off, yes/no, true/false)"
        if self.kind == "names":
            return "device names (a list, or a string separated by commas or spaces; 'auto')"
        return "a string"

    def check(self, value: Any, where: str) -> Any:
        """``value`` (not None) validated and normalised for this row; ``where`` (the options
        class, "RdmaOptions") names it in the error.

        Raises:
            InvalidArgumentError: the value's type or range is wrong; the message names the
                option and what it must be.
        """
        kind = self.kind
        ok = True
        if kind in ("int", "float"):
            number = (int,) if kind == "int" else (int, float)
            ok = isinstance(value, number) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
            ok = ok and (self.low is None or value >= self.low)
            ok = ok and (self.high is None or value <= self.high)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "choice":
            ok = value in self.choices
        elif kind == "names":
            if isinstance(value, str):
                value = value.replace(",", " ").split()
            ok = isinstance(value, Sequence) and len(value) > 0
            ok = ok and all(isinstance(n, str) and n for n in value)
            value = list(value) if ok else value
        elif kind == "secret":
            ok = isinstance(value, (str, bytes))
        else:
            ok = isinstance(value, str)
        if not ok:
            raise InvalidArgumentError(
                f"{where}({self.name}={value!r}): {self.name} must be "
                f"{self.expects()}{self._unit_words()}, or None for the default "
                f"({self.describe_default()})"
            )
        return value

    def parse(self, text: str) -> Any:
        """The value of the environment text ``text`` (not empty; stripped but for a secret).

        Raises:
            InvalidArgumentError: not a valid value; the message names the variable and says
                to fix or unset it.
        """
        value: Any = text
        try:
            if self.kind == "int":
                value = int(text)
            elif self.kind == "float":
                value = float(text)
            elif self.kind == "bool":
                low = text.lower()
                if low not in _ON + _OFF:
                    raise ValueError(text)
                value = low in _ON
            elif self.kind == "choice":
                value = text.lower()
            return self.check(value, f"{self.env}")
        except (ValueError, InvalidArgumentError):
            raise InvalidArgumentError(
                f"{self.env}={text!r} must be {self.expects()}{self._unit_words()} "
                f"({self.name}, default {self.describe_default()}); fix it or unset it"
            ) from None

    def from_env(self, environ: Mapping[str, str] | None = None) -> Any:
        """The variable's value in ``environ`` (default ``os.environ``) parsed, or None when
        the row has no variable or it is unset or empty.

        Raises:
            InvalidArgumentError: the variable holds an invalid value.
        """
        if self.env is None:
            return None
        text = (os.environ if environ is None else environ).get(self.env, "")
        if self.kind != "secret":  # a secret is taken as it is, spaces included
            text = text.strip()
        return self.parse(text) if text else None

    def describe_default(self) -> str:
        """The default in words (None: decided at run time, as the help says)."""
        if self.default is None:
            return "automatic"
        if self.kind == "bool":
            return "on" if self.default else "off"
        return (
            f"{self.default!r}{self._unit_words()}"
            if self.kind != "int"
            else (f"{self.default}{self._unit_words()}")
        )

    def _unit_words(self) -> str:
        return f" {self.unit}" if self.unit else ""

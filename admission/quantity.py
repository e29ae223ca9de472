"""Kubernetes resource quantities ("2", "1e3", "1k", "2Ki", "1500m") as exact numbers.

Contract:
- :func:`parse_quantity` accepts what the API server accepts for a quantity: a string
  ``<sign><digits>[.<digits>]<suffix>`` where the suffix is a binary SI suffix (``Ki``,
  ``Mi``, ``Gi``, ``Ti``, ``Pi``, ``Ei``), a decimal SI suffix (``n``, ``u``, ``m``, none,
  ``k``, ``M``, ``G``, ``T``, ``P``, ``E``) or a decimal exponent (``e3``, ``E-2``); or a
  JSON number (int or finite float; not a bool). The value is returned exactly, as a
  :class:`~fractions.Fraction`. Anything else raises :class:`QuantityError`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))$"
)
# Bounds the work a hostile exponent can cause (the API server caps quantities far lower).
_MAX_EXPONENT = 64
_MAX_LENGTH = 64


class QuantityError(ValueError):
    """A value that is not a valid Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """The exact value of a Kubernetes quantity string or JSON number."""
    if isinstance(value, bool):
        raise QuantityError(f'{value!r} is not a quantity: write a number such as 1 or "2"')
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(
            f'{value!r} ({type(value).__name__}) is not a quantity: use a string like "2"'
        )
    if len(value) <= _MAX_LENGTH and value.isdigit() and value.isascii():
        return Fraction(int(value))  # the common case, e.g. "1": no regex, no scaling
    match = _QUANTITY.match(value) if len(value) <= _MAX_LENGTH else None
    if match is None:
        raise QuantityError(
            f'{value!r} is not a Kubernetes quantity: use e.g. "2", "1k", "2Ki" or "1e3"'
        )
    number = Fraction(match.group("number").removesuffix("."))
    exponent_text = match.group("exp")
    if exponent_text is not None:
        exponent = int(exponent_text[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    suffix = match.group("suffix")
    if suffix in _BINARY:
        return number * Fraction(1024) ** _BINARY[suffix]
    return number * Fraction(10) ** _DECIMAL[suffix]

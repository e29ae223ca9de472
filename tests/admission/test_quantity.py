"""Kubernetes quantity parsing: exact values for every suffix form, clear errors."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.quantity import QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        (2, 2),
        (2.0, 2),
        ("0", 0),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("1e+2", 100),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("2Ki", 2048),
        ("1Mi", 1024**2),
        ("1Gi", 1024**3),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("1Ti", 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1500m", Fraction(3, 2)),
        ("2000m", 2),
        ("500u", Fraction(1, 2000)),
        ("7n", Fraction(7, 10**9)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("+3", 3),
        ("-1", -1),
        ("0.25k", 250),
    ],
)
def test_valid_quantities_parse_exactly(text: object, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "1e",
        "e3",
        "1 ",
        " 1",
        "1Kii",
        "1.2.3",
        "1m5",
        "1KiB",
        "0x10",
        "1_000",
        "--1",
        "1ee3",
        "1e1000",
        "Infinity",
        "nan",
    ],
)
def test_malformed_strings_are_refused(text: str) -> None:
    with pytest.raises(QuantityError, match=r"quantit|exponent"):
        parse_quantity(text)


@pytest.mark.parametrize("value", [True, False, None, [], {}, float("inf"), float("nan")])
def test_non_quantity_types_are_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_overlong_string_is_refused_without_work() -> None:
    with pytest.raises(QuantityError):
        parse_quantity("1" * 10_000)


@given(st.integers(min_value=0, max_value=10**12))
def test_integers_and_their_strings_agree(n: int) -> None:
    assert parse_quantity(n) == parse_quantity(str(n)) == n


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["k", "M", "G", "Ki", "Mi"]))
def test_suffix_scales(n: int, suffix: str) -> None:
    scale = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * scale
    assert parse_quantity(f"{n}e3") == n * 1000

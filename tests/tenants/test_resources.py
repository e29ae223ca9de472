"""Slice arithmetic and resource names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenants import resources


@pytest.mark.parametrize(
    ("name", "slices"),
    [
        ("gpu", 7),
        ("mig-1g.5gb", 1),
        ("mig-1g.10gb.me", 1),
        ("mig-1g.10gb+me", 1),
        ("mig-2g.20gb", 2),
        ("mig-3g.40gb", 3),
        ("mig-3g.71gb", 3),
        ("mig-4g.47gb", 4),
        ("mig-7g.141gb", 7),
    ],
)
def test_slices_of_known_resources(name: str, slices: int) -> None:
    assert resources.slices_of(name) == slices


@pytest.mark.parametrize("name", ["mig-9g.1gb", "gpus", "mig-1g.5gb+xx", "", "mig-"])
def test_unknown_resources_are_refused_with_guidance(name: str) -> None:
    with pytest.raises(resources.UnknownResourceError, match=r"mig-1g\.5gb"):
        resources.slices_of(name)


def test_short_name_maps_only_nvidia_resources() -> None:
    assert resources.short_name("nvidia.com/gpu") == "gpu"
    assert resources.short_name("nvidia.com/mig-1g.18gb") == "mig-1g.18gb"
    assert resources.short_name("cpu") is None
    assert resources.short_name("amd.com/gpu") is None


@pytest.mark.parametrize(
    ("slices", "text"), [(0, "0.00"), (1, "0.14"), (3, "0.43"), (7, "1.00"), (14, "2.00"),
                         (10, "1.43"), (168, "24.00")]
)
def test_gpu_equivalents_two_decimals(slices: int, text: str) -> None:
    assert resources.gpu_equivalents(slices) == text


counts = st.dictionaries(st.sampled_from(sorted(resources.KNOWN_RESOURCES)),
                         st.integers(min_value=1, max_value=1000), max_size=6)


@given(counts)
def test_demand_annotation_round_trips(value: dict[str, int]) -> None:
    assert resources.parse_counts(resources.format_counts(value)) == value


@given(counts)
def test_total_slices_is_integer_sum(value: dict[str, int]) -> None:
    total = resources.total_slices(value)
    assert total == sum(resources.slices_of(k) * v for k, v in value.items())
    assert isinstance(total, int)


@pytest.mark.parametrize("text", ["gpu", "gpu=x", "gpu=-1", "nope=1", "gpu=1,"])
def test_malformed_demand_annotation_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        resources.parse_counts(text)

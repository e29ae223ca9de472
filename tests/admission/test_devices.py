"""Selectors are CEL: a MIG request is priced at the largest published device its
selectors can be given, as a CEL engine evaluates them, never by reading their text.

The property test writes selectors with comments, string literals that look like
selectors, ``||``, ``!``, nested parentheses and ``in`` lists, and checks fairgate's price
against a second, independent CEL engine (cel-python) evaluating the same devices.
"""

from __future__ import annotations

import celpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dra import (
    CLASS_SELECTORS,
    MIG_CLASS,
    MIG_PROFILES,
    PROFILE,
    TEMPLATE,
    claim_spec,
    context,
    dra_pod,
    exact,
    mig_slice,
)

from admission.demand import DemandError, pod_demand
from admission.devices import Device, published_devices, selectable, size_of
from admission.pods import PodView

DEVICES = published_devices([mig_slice(MIG_PROFILES)])


def priced(expression: str, count: int = 1) -> dict[str, int]:
    spec = claim_spec({"exactly": exact(count, MIG_CLASS,
                                        selectors=[{"cel": {"expression": expression}}])})
    return pod_demand(PodView.parse(dra_pod(TEMPLATE)), context({"t": spec}))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # the profile test in a comment is no test at all: every MIG device qualifies
        ('device.attributes["gpu.nvidia.com"].type == "mig" // && '
         + PROFILE.format("1g.5gb") + "\n", "mig-7g.40gb"),
        # ... nor inside a string literal
        ('"' + PROFILE.format("1g.5gb").replace('"', "'") + '" != ""', "mig-7g.40gb"),
        # a real test, however wrapped
        ("((" + PROFILE.format("1g.5gb") + "))", "mig-1g.5gb"),
        ("!(" + PROFILE.format("7g.40gb") + ")", "mig-3g.40gb"),
        ('device.attributes["gpu.nvidia.com"].profile in ["1g.5gb", "2g.10gb"]', "mig-2g.10gb"),
        ('device.attributes["gpu.nvidia.com"].index > 0', "mig-3g.40gb"),
        # an attribute the devices lack: the scheduler can give none of them
        ('device.attributes["gpu.nvidia.com"].memory == "5Gi"', None),
        # what this engine cannot evaluate (Kubernetes' quantity) is assumed to match
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1Gi")) >= 0',
         "mig-7g.40gb"),
    ],
)
def test_a_selector_means_what_cel_says(expression: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(DemandError, match="no ResourceSlice publishes"):
            priced(expression, 7)
    else:
        assert priced(expression, 7) == {expected: 7}


def test_only_the_newest_generation_of_a_pool_is_published() -> None:
    old = mig_slice({"7g.40gb": 1})
    new = mig_slice({"1g.5gb": 2})
    new["spec"]["pool"]["generation"] = 2
    devices = published_devices([old, new])
    assert [d.resource for d in devices] == ["mig-1g.5gb", "mig-1g.5gb"]


def test_attributes_are_grouped_by_domain_and_other_drivers_are_not_gpus() -> None:
    other = mig_slice({"1g.5gb": 1}, driver="example.com")
    other["spec"]["devices"][0]["attributes"]["gpu.nvidia.com/profile"] = {"string": "7g.40gb"}
    (device,) = published_devices([other])
    assert device.resource is None  # priced only by the NVIDIA driver's own devices
    assert device.view["attributes"]["example.com"]["profile"] == "1g.5gb"
    assert device.view["attributes"]["gpu.nvidia.com"]["profile"] == "7g.40gb"


# -- the property: fairgate's price equals an independent CEL engine's ---------------------

ATTRIBUTE = 'device.attributes["gpu.nvidia.com"]'
profiles = st.sampled_from([*MIG_PROFILES, "4g.20gb"])


def _leaf() -> st.SearchStrategy[str]:
    return st.one_of(
        profiles.map(lambda p: f'{ATTRIBUTE}.profile == "{p}"'),
        profiles.map(lambda p: f'{ATTRIBUTE}.profile != "{p}"'),
        st.lists(profiles, min_size=1, max_size=3).map(
            lambda ps: f"{ATTRIBUTE}.profile in [{', '.join(repr(p) for p in ps)}]"),
        st.integers(0, 7).map(lambda i: f"{ATTRIBUTE}.index < {i}"),
        # a string literal that reads like a selector is just a string
        profiles.map(lambda p: f"'{ATTRIBUTE}.profile == \"{p}\"'.size() > 0"),
        st.just("true"),
    )


def _expression() -> st.SearchStrategy[str]:
    return st.recursive(
        _leaf(),
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["&&", "||"]), inner).map(
                lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
            inner.map(lambda e: f"!({e})"),
            st.tuples(inner, profiles).map(
                lambda t: f"{t[0]} // && {ATTRIBUTE}.profile == \"{t[1]}\"\n"),
        ),
        max_leaves=6,
    )


_REFERENCE = celpy.Environment()


def _reference_holds(expression: str, device: Device) -> bool:
    program = _REFERENCE.program(_REFERENCE.compile(expression))
    try:
        return bool(program.evaluate({"device": celpy.json_to_cel(dict(device.view))}))
    except celpy.CELEvalError:
        return False  # a device lacking an attribute is never given


@settings(max_examples=150, deadline=None)
@given(_expression(), st.integers(1, 7))
def test_price_is_the_largest_device_cel_can_give(expression: str, count: int) -> None:
    selectors = [*CLASS_SELECTORS[MIG_CLASS], expression]
    given_devices = [d for d in DEVICES if all(_reference_holds(e, d) for e in selectors)]
    if not given_devices:
        with pytest.raises(DemandError, match="no ResourceSlice publishes"):
            priced(expression, count)
        return
    largest = max((d.resource or "" for d in given_devices), key=size_of)
    assert priced(expression, count) == {largest: count}
    assert all(selectable(selectors, d) for d in given_devices)


def test_unparsable_selectors_count_as_matching_every_device() -> None:
    # the API server refuses such a claim; were one to get through, it is never cheap
    assert priced("device.attributes[", 1) == {"mig-7g.40gb": 1}


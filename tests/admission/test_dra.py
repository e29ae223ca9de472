"""pod_demand through DRA: DeviceClass extended resources, claim templates, shared claims.

Every route a tenant could use to get a GPU without naming ``nvidia.com/*`` is counted in
the same slices, and every request fairgate cannot account is refused with a message that
says what to change (never admitted uncounted).
"""

from __future__ import annotations

from typing import Any

import pytest
from admission_kit import container
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from admission.demand import DemandError, pod_demand
from admission.devices import published_devices
from admission.dra import DEVICE_CLASS_PREFIX, DraContext, DraObject, DraObjects
from admission.pods import PodView
from tenants.models import PlatformConfig

NS = "team-a"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PROFILE = 'device.attributes["gpu.nvidia.com"].profile == "{}"'
CLASS_SELECTORS = {  # as the NVIDIA driver's DeviceClasses select their devices
    GPU_CLASS: ('device.driver == "gpu.nvidia.com" && '
                'device.attributes["gpu.nvidia.com"].type == "gpu"',),
    MIG_CLASS: ('device.driver == "gpu.nvidia.com" && '
                'device.attributes["gpu.nvidia.com"].type == "mig"',),
}
MIG_PROFILES = {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "3g.40gb": 2, "7g.40gb": 1}


def mig_slice(profiles: dict[str, int], *, node: str = "mig-0",
              driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    """A ResourceSlice as the NVIDIA driver publishes MIG devices (profile -> how many)."""
    devices = [{"name": f"mig-{p}-{i}".replace(".", "-"),
                "attributes": {"type": {"string": "mig"}, "profile": {"string": p},
                               "productName": {"string": "A100"}, "index": {"int": i}}}
               for p, n in profiles.items() for i in range(n)]
    return {"spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1}, "devices": devices}}


DEVICES = published_devices([mig_slice(MIG_PROFILES)])


def exact(count: int = 1, device_class: str = GPU_CLASS, **more: Any) -> dict[str, Any]:
    return {"deviceClassName": device_class, "count": count, **more}


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": f"r{i}", **r} for i, r in enumerate(requests)]}}


def mig(profile: str, count: int = 1) -> dict[str, Any]:
    return {"exactly": exact(count, MIG_CLASS,
                             selectors=[{"cel": {"expression": PROFILE.format(profile)}}])}


def dra_pod(claims: list[dict[str, Any]] | None = None,
            limits: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(limits=limits or {})]}
    if claims is not None:
        spec["resourceClaims"] = claims
    return {"metadata": {"name": "p", "namespace": NS}, "spec": spec}


def context(templates: dict[str, dict[str, Any]] | None = None,
            claims: dict[str, dict[str, Any]] | None = None,
            extended: dict[str, str] | None = None,
            rules: dict[str, str] | None = None,
            devices: tuple[Any, ...] = DEVICES) -> DraContext:
    objects = DraObjects(
        extended_names=extended or {},
        templates={(NS, k): DraObject(v, uid=f"uid-t-{k}") for k, v in (templates or {}).items()},
        claims={(NS, k): DraObject(v, uid=f"uid-c-{k}") for k, v in (claims or {}).items()},
        class_selectors=CLASS_SELECTORS,
        devices=devices,
    )
    platform = PlatformConfig.model_validate({"deviceClasses": rules or {}})
    return DraContext(NS, platform.device_class_rules, objects)


TEMPLATE = [{"name": "gpus", "resourceClaimTemplateName": "t"}]
CLAIM = [{"name": "gpus", "resourceClaimName": "c"}]


@pytest.mark.parametrize(
    ("pod", "ctx", "expected"),
    [
        # the implicit extended resource of a DeviceClass (the scheduler makes the claim)
        (dra_pod(limits={DEVICE_CLASS_PREFIX + GPU_CLASS: 8}), context(), {"gpu": 8}),
        # a DeviceClass's extendedResourceName (KEP-5004)
        (dra_pod(limits={"example.com/gpu": 2}),
         context(extended={"example.com/gpu": GPU_CLASS}), {"gpu": 2}),
        # device plugin and DRA in one pod add up
        (dra_pod(TEMPLATE, {"nvidia.com/gpu": 1}),
         context({"t": claim_spec({"exactly": exact(8)})}), {"gpu": 9}),
        # a template's requests add up; count defaults to 1
        (dra_pod(TEMPLATE),
         context({"t": claim_spec({"exactly": exact(3)},
                                  {"exactly": {"deviceClassName": GPU_CLASS}})}), {"gpu": 4}),
        # a shared claim is charged in full
        (dra_pod(CLAIM), context(claims={"c": claim_spec({"exactly": exact(4)})}), {"gpu": 4}),
        # MIG: the profile comes from the selector
        (dra_pod(TEMPLATE), context({"t": claim_spec(mig("1g.5gb", 2))}), {"mig-1g.5gb": 2}),
        # ... also as one conjunct of several
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(1, MIG_CLASS, selectors=[
            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "A100"'
                                   ' && ' + PROFILE.format("3g.40gb")}}])})}),
         {"mig-3g.40gb": 1}),
        # MIG without a profile: the largest device the class can be given
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(2, MIG_CLASS)})}),
         {"mig-7g.40gb": 2}),
        # || is CEL's or: the larger of the two profiles
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(1, MIG_CLASS, selectors=[
            {"cel": {"expression": PROFILE.format("1g.5gb") + " || "
                                   + PROFILE.format("3g.40gb")}}])})}), {"mig-3g.40gb": 1}),
        # firstAvailable counts its largest alternative, in slices
        (dra_pod(TEMPLATE), context({"t": claim_spec({"firstAvailable": [
            {"name": "small", **mig("1g.5gb", 3)["exactly"]},
            {"name": "big", **exact(1)}]})}), {"gpu": 1}),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"firstAvailable": [
            {"name": "small", **mig("3g.40gb", 3)["exactly"]},
            {"name": "big", **exact(1)}]})}), {"mig-3g.40gb": 3}),
        # admin access consumes nothing
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(4, adminAccess=True)})}),
         {}),
        # a class that is not a GPU is not fairgate's business
        (dra_pod(TEMPLATE),
         context({"t": claim_spec({"exactly": exact(2, "fpga.example.com")})}), {}),
        # the platform maps its own classes, and may say one is not a GPU
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(2, "big-gpu.acme.io")})},
                                    rules={"big-gpu.acme.io": "gpu"}), {"gpu": 2}),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(2, "vgpu.acme.io")})},
                                    rules={"vgpu.acme.io": "none"}), {}),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(2, "a100-1g")})},
                                    rules={"a100-1g": "mig-1g.5gb"}), {"mig-1g.5gb": 2}),
    ],
)
def test_every_dra_route_is_counted(pod: dict[str, Any], ctx: DraContext,
                                    expected: dict[str, int]) -> None:
    assert pod_demand(PodView.parse(pod), ctx) == expected


@pytest.mark.parametrize(
    ("pod", "ctx", "says"),
    [
        (dra_pod(TEMPLATE), context(), "ResourceClaimTemplate 't' not found"),
        (dra_pod(CLAIM), context(), "ResourceClaim 'c' not found"),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(
            1, allocationMode="All")})}), "use allocationMode ExactCount"),
        # a profile no slice publishes: nothing to price it by
        (dra_pod(TEMPLATE), context({"t": claim_spec(mig("9g.1gb"))}),
         "no ResourceSlice publishes a device of DeviceClass 'mig.nvidia.com'"),
        # no slices at all yet
        (dra_pod(TEMPLATE), context({"t": claim_spec(mig("1g.5gb"))}, devices=()),
         "no ResourceSlice publishes"),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(1, "h100.acme.io-gpu")})}),
         "looks like a GPU class"),
        (dra_pod(limits={DEVICE_CLASS_PREFIX + "gpu.example.com": 1}), context(),
         "deviceClasses"),
        (dra_pod(limits={DEVICE_CLASS_PREFIX + MIG_CLASS: 1}), context(),
         "cannot say which profile"),
        (dra_pod(TEMPLATE), context({"t": claim_spec({"exactly": exact(-1)})}),
         "count must be a whole number"),
        (dra_pod(TEMPLATE), context({"t": claim_spec({})}), "needs exactly or firstAvailable"),
        (dra_pod(limits={DEVICE_CLASS_PREFIX + GPU_CLASS: "0.5"}), context(), "whole devices"),
    ],
)
def test_what_cannot_be_counted_is_refused_saying_what_to_change(
        pod: dict[str, Any], ctx: DraContext, says: str) -> None:
    with pytest.raises(DemandError, match=says):
        pod_demand(PodView.parse(pod), ctx)


def test_a_template_in_another_namespace_is_not_found() -> None:
    ctx = context({"t": claim_spec({"exactly": exact(8)})})
    other = DraContext("team-b", ctx.rules, ctx.objects)
    with pytest.raises(DemandError, match="not found in namespace 'team-b'"):
        pod_demand(PodView.parse(dra_pod(TEMPLATE)), other)


def test_implicit_extended_resources_follow_the_effective_request_rule() -> None:
    name = DEVICE_CLASS_PREFIX + GPU_CLASS
    pod = dra_pod(limits={name: 1})
    pod["spec"]["initContainers"] = [container("init", {name: 4}),
                                     container("side", {"nvidia.com/gpu": 1},
                                               restartPolicy="Always")]
    # the sidecar runs beside the app container (1 + 1); the init container alone has 4
    assert pod_demand(PodView.parse(pod), context()) == {"gpu": 4}


def test_platform_refuses_an_unknown_device_class_rule() -> None:
    with pytest.raises(ValidationError, match="unknown DeviceClass rule 'gpus'"):
        PlatformConfig.model_validate({"deviceClasses": {"x.io": "gpus"}})


requests = st.lists(
    st.one_of(
        st.integers(0, 16).map(lambda n: ("gpu", n, {"exactly": exact(n)})),
        st.tuples(st.sampled_from(["1g.5gb", "3g.40gb"]), st.integers(0, 7)).map(
            lambda pc: ("mig-" + pc[0], pc[1], mig(pc[0], pc[1]))),
        st.integers(0, 16).map(lambda n: ("", 0, {"exactly": exact(n, adminAccess=True)})),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(requests, st.integers(1, 3))
def test_a_claim_counts_the_sum_of_its_requests(
        reqs: list[tuple[str, int, dict[str, Any]]], claims: int) -> None:
    """Property: a pod with ``claims`` entries naming one template is charged the
    template's devices once per entry; admin access adds nothing."""
    expected: dict[str, int] = {}
    for short, count, _ in reqs:
        if short and count:
            expected[short] = expected.get(short, 0) + count * claims
    entries = [{"name": f"c{i}", "resourceClaimTemplateName": "t"} for i in range(claims)]
    ctx = context({"t": claim_spec(*(r for _, _, r in reqs))})
    assert pod_demand(PodView.parse(dra_pod(entries)), ctx) == expected

"""admission.claimguard: what an admitted pod's claims and templates were priced at, and
the refusal of a claim or template made again under such a name asking for more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_dra import GPU_CLASS, MIG_CLASS, NS, claim_spec, context, dra_pod, exact, mig

from admission.claimguard import (
    CLAIM,
    TEMPLATE,
    DraObjectRef,
    asked,
    created_object,
    exceeds,
    made_for_a_pod,
    priced_objects,
    swap_refusal,
)
from admission.dra import claim_spec_demand, claims_demand
from admission.pods import PodError, PodView
from tenants.resources import ResourceCounts

REF = DraObjectRef(NS, CLAIM, "c")


@dataclass(frozen=True)
class Admitted:
    devices: ResourceCounts
    state: str = "queued"
    namespace: str = NS
    name: str = "p"


def claim(spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": NS, **metadata}, "spec": spec}


def template(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tpl", "namespace": NS}, "spec": {"spec": spec}}


POD_OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}


def test_each_named_object_is_priced_on_its_own() -> None:
    pod = dra_pod([{"name": "a", "resourceClaimName": "c"},
                   {"name": "b", "resourceClaimTemplateName": "tpl"},
                   {"name": "n", "resourceClaimName": "nic"}])
    ctx = context(templates={"tpl": claim_spec({"exactly": exact(2)}, mig("1g.5gb", 3))},
                  claims={"c": claim_spec({"exactly": exact(1)}),
                          "nic": claim_spec({"exactly": exact(4, "nic.example.com")})})
    assert priced_objects(PodView.parse(pod), ctx) == {
        DraObjectRef(NS, CLAIM, "c"): {"gpu": 1},
        DraObjectRef(NS, CLAIM, "nic"): {},  # noted too: swapping it for a GPU claim is more
        DraObjectRef(NS, TEMPLATE, "tpl"): {"gpu": 2, "mig-1g.5gb": 3},
    }
    assert DraObjectRef(NS, TEMPLATE, "tpl").key == f"{NS}/t/tpl"
    assert priced_objects(PodView.parse(dra_pod()), ctx) == {}


def test_a_claim_and_a_template_at_create_are_read_and_priced() -> None:
    ctx = context()
    new = created_object("resource.k8s.io", "ResourceClaim", NS, "",
                         claim(claim_spec({"exactly": exact(8)})))
    assert new is not None and new.ref == REF
    assert asked(new, ctx) == {"gpu": 8}
    tpl = created_object("resource.k8s.io", "ResourceClaimTemplate", NS, "tpl",
                         template(claim_spec(mig("2g.10gb", 2))))
    assert tpl is not None and tpl.ref == DraObjectRef(NS, TEMPLATE, "tpl")
    assert asked(tpl, ctx) == {"mig-2g.10gb": 2}
    every = created_object("resource.k8s.io", "ResourceClaim", NS, "c", claim(claim_spec(
        {"exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "All"}})))
    assert every is not None and isinstance(asked(every, ctx), PodError)
    empty = created_object("resource.k8s.io", "ResourceClaimTemplate", NS, "t", template({}))
    assert empty is not None and asked(empty, ctx) == {}  # a claim for no devices
    bare = created_object("resource.k8s.io", "ResourceClaimTemplate", NS, "t", {"spec": {}})
    assert bare is not None and isinstance(asked(bare, ctx), PodError)
    assert created_object("", "Pod", NS, "p", dra_pod()) is None
    assert created_object("resource.k8s.io", "DeviceClass", "", "x", {}) is None


def test_only_the_claim_controller_makes_claims_for_pods() -> None:
    owned = created_object("resource.k8s.io", "ResourceClaim", NS, "p-gpu-x2k9z",
                           claim(claim_spec({"exactly": exact(8)}),
                                 ownerReferences=[POD_OWNER], generateName="p-gpu-"))
    assert owned is not None
    assert made_for_a_pod(owned, "system:serviceaccount:kube-system:resource-claim-controller")
    assert made_for_a_pod(owned, "system:kube-controller-manager")
    # a tenant user may write the same owner reference: it is judged like any claim
    assert not made_for_a_pod(owned, "alice@example.com")
    unowned = created_object("resource.k8s.io", "ResourceClaim", NS, "c",
                             claim(claim_spec({"exactly": exact(8)})))
    assert unowned is not None and not made_for_a_pod(unowned, "system:kube-controller-manager")


def test_a_swap_for_more_devices_is_refused_with_what_to_do() -> None:
    message = swap_refusal(REF, {"gpu": 8}, [Admitted({"gpu": 1}, "queued", NS, "train-1")])
    assert message is not None
    for part in ("ResourceClaim", "'c'", f"{NS}/train-1 (queued) for gpu=1", "asks for gpu=8",
                 "Delete those pods first", "new name"):
        assert part in message, part
    every = PodError("allocationMode All asks for every matching device")
    message = swap_refusal(REF, every, [Admitted({"gpu": 1})])
    assert message is not None and "cannot be priced (allocationMode All" in message
    assert swap_refusal(REF, {"gpu": 1}, [Admitted({"gpu": 1})]) is None
    assert swap_refusal(REF, {"gpu": 8}, []) is None
    assert swap_refusal(REF, {"mig-1g.5gb": 1}, [Admitted({"gpu": 1})]) is not None
    many = [Admitted({}, name=f"p{i}") for i in range(5)]
    message = swap_refusal(REF, {"gpu": 1}, many)
    assert message is not None and "no GPUs" in message and "and 2 more" in message


json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 10) | st.sampled_from(
        [GPU_CLASS, MIG_CLASS, "All", "ExactCount", "nic.example.com", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["spec", "devices", "requests", "exactly", "firstAvailable", "deviceClassName",
         "count", "allocationMode", "name", "selectors", "metadata"]), inner, max_size=4),
    max_leaves=20)


@given(obj=json, kind=st.sampled_from([CLAIM, TEMPLATE]))
def test_any_object_is_read_and_priced_or_refused_never_raising(obj: Any, kind: str) -> None:
    new = created_object("resource.k8s.io", kind, NS, "x", obj)
    if new is not None:
        result = asked(new, context())
        assert isinstance(result, (dict, PodError))


counts = st.dictionaries(st.sampled_from(["gpu", "mig-1g.5gb", "mig-3g.20gb"]),
                         st.integers(1, 16), max_size=3)


@given(asks=counts, priced=counts)
def test_refused_exactly_when_some_resource_is_more(asks: ResourceCounts,
                                                    priced: ResourceCounts) -> None:
    refused = swap_refusal(REF, asks, [Admitted(priced)]) is not None
    assert refused == exceeds(asks, priced)
    assert refused == any(n > priced.get(k, 0) for k, n in asks.items())
    assert swap_refusal(REF, priced, [Admitted(priced)]) is None  # the same price passes


@given(gpus=st.integers(0, 8), migs=st.integers(0, 7), classes=st.lists(
    st.sampled_from([GPU_CLASS, MIG_CLASS, "nic.example.com"]), min_size=1, max_size=3))
def test_what_is_noted_is_what_the_pod_is_charged(gpus: int, migs: int,
                                                  classes: list[str]) -> None:
    requests = [mig("1g.5gb", migs) if c == MIG_CLASS else {"exactly": exact(gpus, c)}
                for c in classes]
    spec = claim_spec(*requests)
    pod = dra_pod([{"name": "a", "resourceClaimName": "c"}])
    ctx = context(claims={"c": spec})
    view = PodView.parse(pod)
    assert priced_objects(view, ctx) == {REF: claims_demand(view, ctx)}
    new = created_object("resource.k8s.io", "ResourceClaim", NS, "c", claim(spec))
    assert new is not None and asked(new, ctx) == claim_spec_demand(spec, ctx, "c")
    assert swap_refusal(REF, asked(new, ctx), [Admitted(claims_demand(view, ctx))]) is None

"""A ResourceClaim several pods of a tenant share is charged once, by its uid, to one pod
that holds capacity; the others are charged their own demand (admission.sharing, and
admission.dra.shared_claims which names a pod's shared claims)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_dra import CLAIM, TEMPLATE, claim_spec, context, dra_pod, exact

from admission.dra import AllocatedDevice, DraContext, DraObject, priced_record, shared_claims
from admission.pods import PodView
from admission.sharing import Sharer, charged, exemptions, shares_held_claim

GPU3 = claim_spec({"exactly": exact(3)})


def _shared(pod: dict[str, Any], ctx: DraContext) -> dict[str, dict[str, int]]:
    return shared_claims(PodView.parse(pod), ctx)


def test_a_named_claim_is_shared_by_its_uid_and_a_template_is_not() -> None:
    ctx = context({"t": GPU3}, {"c": GPU3})
    assert _shared(dra_pod(CLAIM), ctx) == {"uid-c-c": {"gpu": 3}}
    assert _shared(dra_pod(TEMPLATE), ctx) == {}  # a template's claim is the pod's own
    # a claim not there is not shared: the pod pays for it alone (the plan refused it)
    assert _shared(dra_pod(CLAIM), context()) == {}


def test_a_claim_is_what_it_was_allocated_when_that_is_more_than_its_price() -> None:
    ctx = context(claims={"c": GPU3})
    held = tuple(AllocatedDevice("r0", "gpu.nvidia.com", "p", f"gpu-{i}") for i in range(4))
    claims = {**ctx.objects.claims,
              ("team-a", "c"): DraObject(GPU3, uid="uid-c-c", allocation=held)}
    more = DraContext(ctx.namespace, ctx.rules,
                      type(ctx.objects)(**{**ctx.objects.__dict__, "claims": claims}))
    assert _shared(dra_pod(CLAIM), more) == {"uid-c-c": {"gpu": 4}}


def test_a_claim_made_again_under_the_same_name_is_another_claim() -> None:
    first = context(claims={"c": GPU3})
    again = DraContext(first.namespace, first.rules, type(first.objects)(
        **{**first.objects.__dict__,
           "claims": {("team-a", "c"): DraObject(GPU3, uid="uid-new")}}))
    assert _shared(dra_pod(CLAIM), first).keys() != _shared(dra_pod(CLAIM), again).keys()


def test_a_recorded_claim_is_shared_by_the_uid_and_price_it_was_admitted_for() -> None:
    """The pod's priced-claims stamp names the claim it was priced from: a claim deleted
    or made again under the same name since does not change what the pod shares."""
    admitted = context(claims={"c": GPU3})
    pod = PodView.parse(dra_pod(CLAIM))
    stamped = dra_pod(CLAIM)
    stamped["metadata"]["annotations"] = {
        "fairgate.io/priced-claims": priced_record(pod, admitted)}
    assert stamped["metadata"]["annotations"]["fairgate.io/priced-claims"] == (
        "gpus=ResourceClaim/c/uid-c-c/gpu:3")
    assert _shared(stamped, admitted) == {"uid-c-c": {"gpu": 3}}
    assert _shared(stamped, context()) == {"uid-c-c": {"gpu": 3}}  # deleted since
    again = DraContext(admitted.namespace, admitted.rules, type(admitted.objects)(
        **{**admitted.objects.__dict__, "claims": {("team-a", "c"): DraObject(
            claim_spec({"exactly": exact(1)}), uid="uid-new")}}))
    assert _shared(stamped, again) == {"uid-c-c": {"gpu": 3}}  # made again, smaller


def _pod(uid: str, created: float, holds: bool, tenant: str = "team-a",
         **claims: int) -> Sharer:
    return Sharer(uid, tenant, created, holds, {c: {"gpu": n} for c, n in claims.items()})


def test_the_oldest_pod_holding_capacity_pays_and_the_others_are_exempt() -> None:
    pods = [_pod("a", 2.0, True, x=3), _pod("b", 1.0, True, x=3), _pod("c", 0.0, False, x=3)]
    # b is the oldest that holds capacity; c (older, but gated) rides on it
    assert exemptions(pods) == {"a": {"x"}, "c": {"x"}}


def test_no_pod_is_exempt_while_none_holds_capacity() -> None:
    assert exemptions([_pod("a", 0.0, False, x=3), _pod("b", 1.0, False, x=3)]) == {}


def test_the_charge_moves_to_a_pod_still_holding_when_the_payer_ends() -> None:
    pods = [_pod("a", 0.0, True, x=3), _pod("b", 1.0, True, x=3)]
    assert exemptions(pods) == {"b": {"x"}}
    assert exemptions(pods[1:]) == {}  # a ended: b pays


def test_tenants_are_charged_apart() -> None:
    pods = [_pod("a", 0.0, True, "team-a", x=3), _pod("b", 1.0, True, "team-b", x=3)]
    assert exemptions(pods) == {}


def test_charged_takes_off_only_the_exempt_claims() -> None:
    demand = {"gpu": 6, "mig-1g.5gb": 1}  # its own 1 MIG device, claims x (3) and y (2)
    shared = {"x": {"gpu": 3}, "y": {"gpu": 2}}
    assert charged(demand, shared, {"x"}) == {"gpu": 3, "mig-1g.5gb": 1}
    assert charged(demand, shared, {"x", "y"}) == {"gpu": 1, "mig-1g.5gb": 1}
    assert charged({"gpu": 3}, {"x": {"gpu": 3}}, {"x"}) == {}  # a rider
    assert charged(demand, shared, ()) == demand


def test_shares_held_claim_is_about_the_same_tenant_and_claim() -> None:
    a = _pod("a", 0.0, True, x=3)
    assert shares_held_claim(a, [a, _pod("b", 1.0, False, x=3)])
    assert not shares_held_claim(a, [a, _pod("b", 1.0, False, y=3)])
    assert not shares_held_claim(a, [_pod("b", 1.0, False, "team-b", x=3)])
    assert not shares_held_claim(_pod("c", 0.0, True), [a])


SIZES = {"x": 3, "y": 2}  # a claim (uid) gives the same devices to every pod naming it
SHARERS = st.lists(
    st.tuples(st.sampled_from(["team-a", "team-b"]), st.integers(0, 3).map(float),
              st.booleans(), st.sets(st.sampled_from(sorted(SIZES)))),
    max_size=8,
).map(lambda pods: [Sharer(f"p{i}", tenant, created, holds,
                           {c: {"gpu": SIZES[c]} for c in names})
                    for i, (tenant, created, holds, names) in enumerate(pods)])


@settings(max_examples=300, deadline=None)
@given(SHARERS, st.randoms(use_true_random=False))
def test_each_held_claim_is_charged_exactly_once_per_tenant(
    pods: list[Sharer], order: Any,
) -> None:
    """Among the pods holding capacity, each (tenant, claim) is charged to exactly one;
    a pod is exempt only from a claim that such a pod of its tenant pays; the answer does
    not depend on the order the pods come in."""
    exempt = exemptions(pods)
    shuffled = list(pods)
    order.shuffle(shuffled)
    assert exemptions(shuffled) == exempt
    for tenant in ("team-a", "team-b"):
        for claim in ("x", "y"):
            naming = [p for p in pods if p.tenant == tenant and claim in p.claims]
            paying = [p for p in naming if claim not in exempt.get(p.uid, ())]
            holders = [p for p in naming if p.holds]
            if holders:
                assert len(paying) == 1 and paying[0].holds
            else:
                assert paying == naming  # nobody holds it: whoever is released pays
    held = {(p.tenant, c): n["gpu"] for p in pods if p.holds for c, n in p.claims.items()}
    charge = sum(charged({"gpu": sum(n["gpu"] for n in p.claims.values())}, p.claims,
                         exempt.get(p.uid, ())).get("gpu", 0) for p in pods if p.holds)
    assert charge == sum(held.values())

"""Who is charged for a ResourceClaim that several pods of a tenant share.

Contract (docs/dra.md, "Shared claims"):
- A claim named by ``spec.resourceClaims[].resourceClaimName`` (not made from a
  template) is charged to its tenant once, keyed by its uid
  (:func:`admission.dra.shared_claims`), however many of the tenant's pods name it.
- It is charged to one *payer*: while any of those pods holds capacity (released and
  not finished), the oldest such pod (creation time, then uid) pays, and every other
  pod naming that uid is *exempt* from it (charged only its own demand: containers,
  templates' claims and the shared claims it pays). While none holds capacity, every
  pod naming it pays it in full: a pod is released exempt only while another pod
  already holds, and is charged for, those devices.
- So when the payer ends while other pods still hold the claim, the oldest of them
  pays from then on; usage never drops while the devices are held.
- Tenants are kept apart: the payer is chosen per (tenant, uid). A claim lives in one
  namespace, and a namespace belongs to one tenant, so only pods stamped for different
  tenants (a namespace moved between tenants while its pods run) can name the same
  claim from two tenants; each such tenant pays it once.
- A claim is known by the uid the pod was priced for at admission (its
  ``fairgate.io/priced-claims`` stamp): a claim made again under the same name has a
  new uid, so pods created after that name a new demand.
Pure: pods come in as :class:`Sharer`, plain data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tenants.resources import ResourceCounts


@dataclass(frozen=True)
class Sharer:
    """A pod as the accounting of shared claims sees it: its uid, tenant, when it was
    created, whether it holds capacity, and its shared claims (claim uid -> devices)."""

    uid: str
    tenant: str
    created: float
    holds: bool
    claims: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def payers(pods: Iterable[Sharer]) -> dict[tuple[str, str], str]:
    """(tenant, claim uid) -> the uid of the pod that pays that claim (the oldest of the
    tenant's pods naming it that holds capacity); claims no such pod holds are left out."""
    paying: dict[tuple[str, str], str] = {}
    for pod in sorted((p for p in pods if p.holds), key=lambda p: (p.created, p.uid)):
        for claim in pod.claims:
            paying.setdefault((pod.tenant, claim), pod.uid)
    return paying


def exemptions(pods: Iterable[Sharer]) -> dict[str, frozenset[str]]:
    """Pod uid -> the claim uids it names and is not charged for (pods exempt from
    nothing are left out)."""
    listed = list(pods)
    paying = payers(listed)
    out: dict[str, frozenset[str]] = {}
    for pod in listed:
        exempt = frozenset(c for c in pod.claims
                           if (payer := paying.get((pod.tenant, c))) is not None
                           and payer != pod.uid)
        if exempt:
            out[pod.uid] = exempt
    return out


def charged(demand: Mapping[str, int], claims: Mapping[str, Mapping[str, int]],
            exempt: Iterable[str]) -> ResourceCounts:
    """``demand`` (which counts each of ``claims`` in full) less the claims in
    ``exempt``, by resource (positive counts only)."""
    left = dict(demand)
    for claim in set(exempt):
        for short, count in claims.get(claim, {}).items():
            left[short] = left.get(short, 0) - count
    return {short: count for short, count in left.items() if count > 0}


def shares_held_claim(pod: Sharer, others: Iterable[Sharer]) -> bool:
    """Whether another pod of ``pod``'s tenant names a claim ``pod`` names: the charge
    of that claim may move when ``pod`` starts or stops holding capacity."""
    return bool(pod.claims) and any(
        other.uid != pod.uid and other.tenant == pod.tenant
        and not other.claims.keys().isdisjoint(pod.claims)
        for other in others)

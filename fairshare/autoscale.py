"""Autoscaled GPU pools: which heads get nodes, and what a ProvisioningRequest says.

Contract (pure: no I/O; the dispatcher does the cluster and queue calls):
- :func:`grown_capacity`: the capacity the queue fits entries against when asking for
  nodes: per key of ``maxCapacity``, the larger of what exists and the maximum; other
  keys as they exist. Fair shares keep the capacity that exists.
- :func:`free_slots`: how many more heads may wait for nodes (``inFlight`` less those
  waiting), never below 0.
- :func:`verdict` reads a ProvisioningRequest's ``status.conditions``
  (cluster-autoscaler's types, ``autoscaling.x-k8s.io/v1``): ``provisioned`` once
  ``Provisioned`` is True; ``failed`` when ``Failed``, ``BookingExpired`` or
  ``CapacityRevoked`` is True (these win: a request may show Provisioned and later
  expire); else ``waiting``. The message is the deciding condition's.
- :func:`backoff`: seconds before the ``attempt``-th retry (1: first retry): doubling
  from ``BACKOFF_BASE``, at most ``BACKOFF_MAX``.
- :func:`request_name`: the ProvisioningRequest (and PodTemplate prefix) name of a head's
  ``attempt``-th request, a DNS label derived from its key, so a restarted dispatcher
  finds its own request. A retry is a new request (``-<attempt>`` from the second): a
  request's spec cannot change, and fairgate deletes none (the pods own them).
- :class:`Head`: an entry (a pod, or a whole gang) released towards nodes that do not
  exist yet, until its pods are bound to nodes or gone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tenants.models import AutoscalingSpec

PROVISIONING_API = "autoscaling.x-k8s.io/v1"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
"""Pod annotations (cluster-autoscaler's ``ProvisioningRequestPodAnnotationKey`` and
``ProvisioningClassPodAnnotationKey``): the pods consume the named request's capacity."""
HEAD_LABEL = "fairgate.io/provisioning-for"
"""Label on the requests and PodTemplates fairgate makes: the head's key, hashed."""
BACKOFF_BASE = 30.0
BACKOFF_MAX = 600.0
FAILED_CONDITIONS = ("Failed", "BookingExpired", "CapacityRevoked")

Verdict = Literal["waiting", "provisioned", "failed"]
HeadState = Literal["requesting", "retrying", "released"]


def grown_capacity(existing: Mapping[str, int], spec: AutoscalingSpec) -> dict[str, int]:
    """What the pools may hold: ``maxCapacity`` where it is more than what exists."""
    grown = dict(existing)
    for key, most in spec.max_capacity.items():
        grown[key] = max(grown.get(key, 0), most)
    return grown


def free_slots(spec: AutoscalingSpec, waiting: int) -> int:
    """How many more heads may wait for nodes now."""
    return max(0, spec.in_flight - waiting) if spec.enabled else 0


def verdict(conditions: Sequence[Mapping[str, Any]]) -> tuple[Verdict, str]:
    """What a request's conditions say, and the deciding condition's message."""
    true = {str(c.get("type")): c for c in conditions if c.get("status") == "True"}
    for kind in FAILED_CONDITIONS:
        if kind in true:
            return "failed", _said(true[kind])
    if "Provisioned" in true:
        return "provisioned", _said(true["Provisioned"])
    return "waiting", next((_said(c) for c in conditions if c.get("message")), "")


def _said(condition: Mapping[str, Any]) -> str:
    reason, message = condition.get("reason") or "", condition.get("message") or ""
    return f"{condition.get('type')}: {reason}" + (f" ({message})" if message else "")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1 is the first retry)."""
    return float(min(BACKOFF_MAX, BACKOFF_BASE * 2 ** max(0, attempt - 1)))


def request_name(key: str, attempt: int = 1) -> str:
    """A DNS-label name for request ``attempt`` of head ``key`` (stable across restarts)."""
    base = "fairgate-" + hashlib.sha256(key.encode()).hexdigest()[:20]
    return base if attempt <= 1 else f"{base}-{attempt}"


@dataclass
class Head:
    """An entry released towards nodes that may not exist yet.

    ``key``: the gang (``namespace/group``) or the ticket; ``tickets`` its pods;
    ``state``: ``requesting`` (a ProvisioningRequest is out, the pods stay gated),
    ``retrying`` (the last request failed: a new one at ``retry_at``) or ``released``
    (gates lifted: waiting for the scheduler to bind them to nodes)."""

    key: str
    tickets: tuple[str, ...]
    tenant: str
    demand: Mapping[str, int]
    since: float
    state: HeadState
    attempts: int = 1
    retry_at: float = 0.0
    message: str = ""
    releases: list[Any] = field(default_factory=list)  # the queue's Release per pod
    seen: set[str] = field(default_factory=set)  # tickets whose pods the watch has shown

    @property
    def request(self) -> str:
        """The name of this head's current ProvisioningRequest."""
        return request_name(self.key, self.attempts)

    def to_json(self, now: float) -> dict[str, Any]:
        """What ``fairgate status`` and ``fairgate why`` show of it."""
        return {"key": self.key, "tickets": list(self.tickets), "tenant": self.tenant,
                "demand": dict(self.demand), "since": self.since, "state": self.state,
                "request": self.request, "attempts": self.attempts,
                "retry_in": max(0.0, self.retry_at - now) if self.state == "retrying" else None,
                "message": self.message}

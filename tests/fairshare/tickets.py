"""How the queue tests name the pods behind tickets (invariant 7: a ticket is bound to
the uid of the first pod seen with it)."""

from __future__ import annotations

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Confirmation, PodRequest


def pod_uid(ticket: str) -> str:
    """The uid the tests give the pod of ``ticket``."""
    return f"uid-{ticket}"


def seen(q: FairQueue, req: PodRequest, name: str | None = None) -> Confirmation:
    """The dispatcher sees ``req``'s pod (named ``name``, default the admitted name)."""
    return q.confirm(req.ticket, pod_uid(req.ticket), req.namespace, name or req.name)

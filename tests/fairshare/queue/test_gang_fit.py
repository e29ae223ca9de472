"""What fits runs, what never fits is refused at CREATE: random quotas (nominal,
inferenceReserve, borrowLimit) and gangs (fairgate.io/pod-group) on an idle cluster,
through the webhook's CREATE decision (plan_create) and the real queue on a real
redis-server.

The oracle is the quota rule in its plainest words, written here independently of
the code under test: training may hold nominal less the inference reserve plus the
borrow limit; inference may hold nominal and never borrows. A gang runs all at once,
so it is judged by its whole demand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.plan import Denied, PodPlan, plan_create
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.models import TENANT_LABEL, FairgateConfig, PodClass
from tests.fairshare.queue.test_queue import config
from tests.fairshare.tickets import pod_uid

CAPACITY = {"gpu": 64}  # more than any quota below can ever grant: the cluster has room


def quota_config(nominal: int, reserve: int, borrow: int) -> FairgateConfig:
    base = config(a={"nominal": {"gpu": nominal}, "reserve": reserve, "borrow": borrow})
    return dataclasses.replace(base, namespaces={"ns-a": {TENANT_LABEL: "a"}})


def member(name: str, gpus: int, inference: bool, size: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns-a"}
    if size > 1:
        metadata["labels"] = {"fairgate.io/pod-group": "ddp"}
        metadata["annotations"] = {"fairgate.io/pod-group-size": str(size)}
    if inference:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                        "name": "rs", "uid": "u", "controller": True}]
    else:
        metadata["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                        "name": "job", "uid": "u", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nominal=st.integers(0, 6), reserve_part=st.integers(0, 6), borrow=st.integers(0, 4),
       size=st.integers(1, 6), gpus=st.integers(1, 3), inference=st.booleans())
def test_what_fits_runs_and_only_what_never_fits_is_refused(
    redis_client: redis.Redis, nominal: int, reserve_part: int, borrow: int, size: int,
    gpus: int, inference: bool,
) -> None:
    reserve = min(reserve_part, nominal)
    whole = size * gpus
    fits = whole <= nominal if inference else whole <= nominal - reserve + borrow
    redis_client.flushall()
    cfg = quota_config(nominal, reserve, borrow)
    queue = FairQueue(redis_client)
    queue.sync_config(cfg, CAPACITY)
    plans = [plan_create(member(f"p{i}", gpus, inference, size), "ns-a", f"uid-{i}", cfg)
             for i in range(size)]
    if not fits:
        for result in plans:
            assert isinstance(result, Denied), (result, whole)
            assert result.code == "never-fits"
            assert f"gpu={whole}" in result.message  # it names what was asked, in all
        return
    bands, reserved = set(), set()
    for i, result in enumerate(plans):
        assert isinstance(result, PodPlan), result  # nothing that fits is refused
        admission = queue.admit(PodRequest(
            ticket=result.ticket, tenant="a", namespace="ns-a", name=f"p{i}",
            pod_class=result.pod_class, demand=result.demand,
            group=result.group.name if result.group else None,
            group_size=result.group.size if result.group else 1,
            submitted_at=float(i)), float(i))
        assert admission.waiting_for is None or "never fits" not in admission.waiting_for, (
            admission)
        bands.add(admission.band)
        if admission.outcome == "reserved":
            reserved.add(result.ticket)
    assert len(bands) == 1, bands  # a gang's members share one priority band
    if not inference and whole > nominal - reserve:
        assert bands == {"borrowed"}  # above what training may hold of nominal
    released = {r.ticket for r in queue.dispatch(float(size), 100)}
    # on an idle cluster with room, all of it runs now: admitted at once or released
    assert released | reserved == {p.ticket for p in plans if isinstance(p, PodPlan)}, (
        released, reserved)


def test_a_borrowed_gang_keeps_the_nominal_room_it_stands_in(redis_client: redis.Redis) -> None:
    """Nominal 4, inferenceReserve 1, borrowLimit 2: a borrowed gang of four 1-GPU pods
    uses the 3 GPUs of nominal training leaves unused and borrows 1. A 3-GPU training
    pod then fits what training may hold of nominal alone, but admitting it would make
    7 GPUs against nominal + borrowLimit = 6 (invariant 1): it waits until the gang
    ends, and then runs. Inference still gets its reserve meanwhile."""
    redis_client.flushall()
    queue = FairQueue(redis_client)
    queue.sync_config(quota_config(4, 1, 2), {"gpu": 12})

    def request(name: str, gpus: int, pod_class: PodClass = "training",
                size: int = 1) -> PodRequest:
        return PodRequest(ticket=name, tenant="a", namespace="ns-a", name=name,
                          pod_class=pod_class, demand={"gpu": gpus},
                          group="ddp" if size > 1 else None, group_size=size,
                          submitted_at=0.0)

    def held() -> tuple[int, int, int]:
        (status,) = queue.tenant_status()
        return status.inference_slices, status.training_slices, status.borrowed_slices

    gang = [request(f"m{i}", 1, size=4) for i in range(4)]
    for pod in gang:
        assert queue.admit(pod, 1.0).band == "borrowed"
    assert {r.ticket for r in queue.dispatch(2.0, 100)} == {p.ticket for p in gang}
    assert held() == (0, 0, 28)
    big = queue.admit(request("big", 3), 3.0)
    assert (big.outcome, big.band) == ("queued", "training"), big
    assert big.waiting_for is not None and "never" not in big.waiting_for
    assert queue.dispatch(4.0, 100) == []
    assert held() == (0, 0, 28)  # 4 GPUs, not 7
    # the reserve is inference's: the gang's 4 + 1 = 5 GPUs of nominal 4 + borrowLimit 2
    assert queue.admit(request("serve", 1, "inference"), 5.0).outcome == "reserved"
    assert held() == (7, 0, 28)
    for pod in gang:
        assert queue.release(pod.ticket, pod_uid(pod.ticket), 6.0)
    assert [r.ticket for r in queue.dispatch(7.0, 100)] == ["big"]
    assert held() == (7, 21, 0)

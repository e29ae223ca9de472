"""The simulated cluster's scheduler: placement, completion and the kube-scheduler's
preemption order (lowest priority first, then the newest), and controllers re-creating
preempted pods."""

from __future__ import annotations

from fairshare.cluster.cluster import ChangeKind, LiftOutcome
from fairshare.sim.simcluster import Placement, PodSpec, SimulatedCluster, VirtualClock
from tenants.models import PodClass, PriorityBand


class _Webhook:
    """Gives each pod the band the test asks for (by name prefix), never gated unless the
    name says so; remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, spec: PodSpec, uid: str) -> Placement:
        self.asked.append(spec.name)
        band: PriorityBand = "inference"
        candidates: tuple[PriorityBand, ...] = ("borrowed", "training")
        for candidate in candidates:
            if spec.name.startswith(candidate):
                band = candidate
        gated = "gated" in spec.name or spec.name.endswith("-r1")  # re-created: queued
        return Placement(f"ticket-{uid}", band, gated=gated)


def _cluster(gpus: int) -> tuple[SimulatedCluster, VirtualClock, _Webhook]:
    clock = VirtualClock(0.0)
    hook = _Webhook()
    return SimulatedCluster({"gpu": gpus}, hook, clock), clock, hook


def _spec(name: str, gpus: int = 1, duration: float = 100.0, group: str | None = None,
          size: int = 1) -> PodSpec:
    cls: PodClass = "inference" if name.startswith("inference") else "training"
    return PodSpec(namespace="ns", name=name, tenant="team-a", pod_class=cls,
                   demand={"gpu": gpus}, duration=duration, group=group, group_size=size)


def _running(cluster: SimulatedCluster) -> list[str]:
    return sorted(p.ref.name for p in cluster.list_pods() if p.phase == "Running")


def test_pods_run_for_their_duration_and_free_their_gpus() -> None:
    cluster, clock, _ = _cluster(1)
    first = cluster.create_pod(_spec("training-a", duration=10))
    waiting = cluster.create_pod(_spec("training-gated", duration=5))
    assert _running(cluster) == ["training-a"]
    assert cluster.lift_gate(waiting) is LiftOutcome.LIFTED
    assert [p.ref.name for p in cluster.pending_released()] == ["training-gated"]
    assert cluster.next_completion() == 10
    clock.advance_to(10)
    cluster.advance()
    assert _running(cluster) == ["training-gated"]
    assert cluster.history[first.uid].ended == 10
    kinds = [(c.kind, c.pod.ref.name if c.pod else None, c.pod.phase if c.pod else None)
             for c in cluster.changes(0)]
    assert (ChangeKind.POD, "training-a", "Succeeded") in kinds
    assert (ChangeKind.POD, "training-gated", "Running") in kinds
    assert cluster.lift_gate(waiting) is LiftOutcome.NOT_GATED


def test_preemption_takes_the_lowest_priority_then_the_newest() -> None:
    cluster, clock, hook = _cluster(4)
    names = ["borrowed-old", "borrowed-new", "training-old", "training-new"]
    for when, name in enumerate(names):
        clock.advance_to(float(when))
        cluster.create_pod(_spec(name))
    evicted: list[str] = []
    for i in range(4):
        clock.advance_to(10.0 + i)
        cluster.create_pod(_spec(f"inference-{i}"))
        gone = sorted(set(names) - set(_running(cluster)) - set(evicted))
        assert len(gone) == 1
        evicted += gone
    assert evicted == ["borrowed-new", "borrowed-old", "training-new", "training-old"]
    assert cluster.preemptions == 4
    # each was re-created by its controller, as a new pod with a new admission
    assert hook.asked[-4:] != names and sorted(
        n for n in hook.asked if n.endswith("-r1")
    ) == sorted(f"{n}-r1" for n in names)


def test_a_pod_preempts_only_as_much_as_it_needs() -> None:
    cluster, _, _ = _cluster(4)
    for name in ("borrowed-a", "borrowed-b", "training-c"):
        cluster.create_pod(_spec(name))
    cluster.create_pod(_spec("inference-2", gpus=2))  # 1 GPU free: one victim is enough
    assert cluster.preemptions == 1
    assert _running(cluster) == ["borrowed-a", "inference-2", "training-c"]  # b is newer


def test_borrowed_pods_never_preempt_and_nobody_is_evicted_in_vain() -> None:
    cluster, _, _ = _cluster(2)
    cluster.create_pod(_spec("training-a"))
    cluster.create_pod(_spec("training-b"))
    cluster.create_pod(_spec("borrowed-x"))
    assert _running(cluster) == ["training-a", "training-b"]  # borrowed waits
    cluster.create_pod(_spec("inference-big", gpus=3))  # cannot fit even by evicting all
    assert _running(cluster) == ["training-a", "training-b"]
    assert cluster.preemptions == 0


def test_preempting_a_gang_member_restarts_the_whole_gang() -> None:
    cluster, _, hook = _cluster(3)
    for i in range(3):
        cluster.create_pod(_spec(f"training-g{i}", group="g", size=3))
    cluster.create_pod(_spec("inference-x"))
    assert _running(cluster) == ["inference-x"]
    assert cluster.preemptions == 3
    recreated = [p for p in cluster.list_pods() if p.ref.name.endswith("-r1")]
    assert sorted(p.ref.name for p in recreated) == ["training-g0-r1", "training-g1-r1",
                                                     "training-g2-r1"]
    assert {p.group for p in recreated} == {"g-r1"}
    assert len(hook.asked) == 7

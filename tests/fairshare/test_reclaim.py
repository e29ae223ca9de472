"""The reclaim rule (fairshare.reclaim.choose), table by table, and its potential; the
borrowed pods given back to inference (fairshare.reclaim.for_inference) and when fairgate
may evict them ahead of the kube-scheduler (fairshare.reclaim.as_the_scheduler_would)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairshare.cluster.cluster import GpuPod, PodRef
from fairshare.reclaim import (
    Owed,
    Standing,
    Victim,
    as_the_scheduler_would,
    choose,
    choose_in_turn,
    due,
    for_inference,
)
from tenants.models import ReclaimSpec

SPEC = ReclaimSpec.model_validate({"after": "5m", "minRuntime": "30m", "perHour": 4})
NOW = 100_000.0
LONG_AGO = NOW - 3 * 3600
OWED = Owed("new", lacks={"gpu": 8}, demand={"gpu": 8}, since=NOW - 600)
# 16 GPUs, two tenants of equal weight: "old" holds all of them, "new" waits
EVEN = {"old": Standing(used=16, entitlement=8), "new": Standing(used=0, entitlement=8)}


def pod(key: str, tenant: str = "old", gpus: int = 8, started: float = LONG_AGO,
        **more: object) -> Victim:
    return Victim(key, tenant, {"gpu": gpus}, started, **more)  # type: ignore[arg-type]


def keys(chosen: list[Victim]) -> list[str]:
    return [v.key for v in chosen]


@pytest.mark.parametrize(
    ("case", "owed", "standings", "victims", "recent", "expected"),
    [
        ("the youngest long-running preemptible pod", OWED, EVEN,
         [pod("a", started=LONG_AGO), pod("b", started=LONG_AGO + 60)], [], ["b"]),
        ("the head has not waited `after` yet",
         Owed("new", {"gpu": 8}, {"gpu": 8}, NOW - 60), EVEN, [pod("a")], [], []),
        ("a pod that ran less than minRuntime is kept", OWED, EVEN,
         [pod("a", started=NOW - 600)], [], []),
        ("a pod not labelled preemptible is kept", OWED, EVEN,
         [pod("a", preemptible=False)], [], []),
        ("inference is never a victim", OWED, EVEN, [pod("a", training=False)], [], []),
        ("the owed tenant's own pods are not victims", OWED,
         {"new": Standing(8, 16), "old": Standing(0, 0)}, [pod("a", tenant="new")], [], []),
        ("a tenant at its entitlement loses nothing", OWED,
         {"old": Standing(8, 8), "new": Standing(0, 8)}, [pod("a")], [], []),
        ("a victim's tenant never falls below its entitlement", OWED,
         {"old": Standing(12, 8), "new": Standing(0, 8)}, [pod("a")], [], []),
        ("no reclaim for a tenant at its entitlement", OWED,
         {"old": Standing(16, 8), "new": Standing(8, 8)}, [pod("a")], [], []),
        ("strict improvement: the victim keeps at least the owed tenant's ratio",
         Owed("new", {"gpu": 8}, {"gpu": 8}, NOW - 600),
         {"old": Standing(16, 6), "new": Standing(0, 4)}, [pod("a")], [], []),
        ("the same with a smaller head: a strict improvement, so it is made",
         Owed("new", {"gpu": 4}, {"gpu": 4}, NOW - 600),
         {"old": Standing(16, 6), "new": Standing(0, 4)}, [pod("a")], [], ["a"]),
        ("the hour's budget is spent", OWED, EVEN, [pod("a")],
         [NOW - 10, NOW - 20, NOW - 30, NOW - 40], []),
        ("reclaims older than an hour do not count", OWED, EVEN, [pod("a")],
         [NOW - 3601] * 4, ["a"]),
        ("a gang counts all its pods against the budget", OWED, EVEN,
         [pod("g", pods=5)], [], []),
        ("a whole gang within the budget", OWED, EVEN, [pod("g", pods=4)], [], ["g"]),
        ("no more than the head lacks, youngest first",
         Owed("new", {"gpu": 2}, {"gpu": 2}, NOW - 600),
         {"old": Standing(16, 8), "new": Standing(0, 8)},
         [pod(k, gpus=1, started=LONG_AGO + i) for i, k in enumerate("abcd")], [], ["d", "c"]),
        ("all or nothing: what can be taken does not free what the head lacks", OWED,
         {"old": Standing(11, 8), "new": Standing(0, 8)},
         [pod(k, gpus=1) for k in "abcd"], [], []),
        ("furthest above its entitlement first",
         Owed("new", {"gpu": 1}, {"gpu": 1}, NOW - 600),
         {"a": Standing(6, 4), "b": Standing(8, 4), "new": Standing(0, 4)},
         [pod("a1", tenant="a", gpus=1, started=NOW - 3000),
          pod("b1", tenant="b", gpus=1, started=LONG_AGO)], [], ["b1"]),
        ("a tenant the queue released a pod to while the head waited is passed over",
         OWED, EVEN, [pod("a"), pod("b", gpus=1, released=NOW - 300)], [], []),
        ("... whichever of its pods is the victim, and other tenants are not",
         Owed("new", {"gpu": 4}, {"gpu": 4}, LONG_AGO + 100),
         {"old": Standing(8, 4), "other": Standing(8, 4), "new": Standing(0, 8)},
         [pod("a", tenant="old", gpus=4),
          pod("b", tenant="other", gpus=4, started=NOW - 3000, released=NOW - 3000)],
         [], ["a"]),
        ("a pod released before the head was created is a victim", OWED, EVEN,
         [pod("a", released=NOW - 601)], [], ["a"]),
        ("a pod that frees nothing the head lacks is kept",
         Owed("new", {"mig-1g.5gb": 1}, {"mig-1g.5gb": 1}, NOW - 600), EVEN,
         [pod("a")], [], []),
    ],
)
def test_reclaim_rule(case: str, owed: Owed, standings: dict[str, Standing],
                      victims: list[Victim], recent: list[float], expected: list[str]) -> None:
    assert keys(choose(owed, standings, victims, SPEC, NOW, recent)) == expected, case


def potential(standings: dict[str, Standing]) -> float:
    return sum(s.used ** 2 / s.entitlement for s in standings.values())


@settings(max_examples=300, deadline=None)
@given(
    used=st.lists(st.integers(0, 32), min_size=3, max_size=3),
    weights=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=8),
    lacks=st.integers(1, 8),
)
def test_every_reclaim_lowers_the_potential_and_cannot_be_reversed(
    used: list[int], weights: list[int], sizes: list[int], lacks: int,
) -> None:
    names = ["new", "x", "y"]
    capacity = max(sum(used), 1)
    standings = {n: Standing(float(u), capacity * w / sum(weights))
                 for n, u, w in zip(names, used, weights, strict=True)}
    victims = [pod(f"p{i}", tenant=names[1 + i % 2], gpus=s) for i, s in enumerate(sizes)]
    owed = Owed("new", {"gpu": lacks}, {"gpu": lacks}, NOW - 600)
    spec = ReclaimSpec.model_validate({"after": 0, "minRuntime": 0, "perHour": 100})
    chosen = choose(owed, standings, victims, spec, NOW, [])
    if not chosen:
        return
    moved = sum(v.gpus for v in chosen)
    after = dict(standings)
    for v in chosen:
        assert standings[v.tenant].used > standings[v.tenant].entitlement
        s = after[v.tenant]
        after[v.tenant] = Standing(s.used - v.gpus, s.entitlement)
        assert after[v.tenant].used >= s.entitlement
    # the head takes what it asks; a victim that frees more (an 8-GPU pod for a 1-GPU
    # head) leaves the rest to the queue, not to reclaim
    gained = min(moved, lacks)
    o = after["new"]
    after["new"] = Standing(o.used + gained, o.entitlement)
    assert potential(after) < potential(standings)
    # the reverse, right after: no victim tenant may reclaim from the owed one
    for v in chosen:
        back = Owed(v.tenant, {"gpu": 1}, {"gpu": 1}, NOW - 600)
        theirs = [pod(f"r{i}", tenant="new", gpus=1) for i in range(int(gained))]
        assert choose(back, after, theirs, spec, NOW, []) == []


@pytest.mark.parametrize(
    ("case", "short", "borrowed", "expected"),
    [
        ("nothing short, nothing evicted", {"gpu": 0}, [pod("a", gpus=1)], []),
        ("the youngest first, no more than is short", {"gpu": 2},
         [pod(k, gpus=1, started=NOW - 100 + i) for i, k in enumerate("abcd")], ["d", "c"]),
        ("a gang whole, though it frees more than is short", {"gpu": 1},
         [pod("g", gpus=4, pods=4, started=NOW - 10), pod("a", gpus=1, started=NOW - 50)],
         ["g"]),
        ("a pod that frees nothing short is kept", {"gpu": 1},
         [pod("m", gpus=0, started=NOW), pod("a", gpus=1, started=NOW - 50)], ["a"]),
        ("as far as the borrowed pods go", {"gpu": 3}, [pod("a", gpus=1)], ["a"]),
        ("each resource short is covered", {"gpu": 1, "mig-1g.10gb": 1},
         [Victim("m", "old", {"mig-1g.10gb": 1}, NOW - 500),
          pod("a", gpus=1, started=NOW - 400), pod("b", gpus=1, started=NOW - 300)],
         ["b", "m"]),
    ],
)
def test_borrowed_pods_given_back_to_inference(case: str, short: dict[str, int],
                                               borrowed: list[Victim],
                                               expected: list[str]) -> None:
    assert keys(for_inference(short, borrowed)) == expected, case


def lent(ticket: str, started_at: float | None, key: str = "gpu", n: int = 1) -> GpuPod:
    return GpuPod(ref=PodRef("old-ns", ticket), uid=ticket, ticket=ticket, tenant="old",
                  pod_class="training", band="borrowed", demand={key: n}, group=None,
                  group_size=1, phase="Running", gated=False, node="node-1", created=0.0,
                  started_at=started_at)


def chose(*tickets: str) -> list[Victim]:
    return [Victim(t, "old", {"gpu": 1}, NOW, tickets=(t,)) for t in tickets]


@pytest.mark.parametrize(
    ("case", "demand", "chosen", "borrowed", "certain"),
    [
        ("one GPU; the youngest started alone in its second", {"gpu": 1}, chose("b"),
         [lent("a", NOW - 10), lent("b", NOW - 9)], True),
        ("the two youngest started in one second: a tie the scheduler breaks at random",
         {"gpu": 1}, chose("b"), [lent("a", NOW - 9), lent("b", NOW - 9)], False),
        ("fairgate chose another than the youngest", {"gpu": 1}, chose("a"),
         [lent("a", NOW - 10), lent("b", NOW - 9)], False),
        ("a pod already going is still the scheduler's youngest", {"gpu": 1}, chose("a"),
         [lent("a", NOW - 10), lent("gone", NOW - 5)], False),
        ("two GPUs: the scheduler picks a node, not pods", {"gpu": 2}, chose("a", "b"),
         [lent("a", NOW - 10), lent("b", NOW - 9)], False),
        ("two keys", {"gpu": 1, "mig-1g.10gb": 1}, chose("b"),
         [lent("a", NOW - 10), lent("b", NOW - 9)], False),
        ("the youngest holding the key asked counts, not another key's",
         {"mig-1g.10gb": 1}, chose("m"),
         [lent("m", NOW - 10, key="mig-1g.10gb"), lent("b", NOW - 9)], True),
        ("a start time not reported yet", {"gpu": 1}, chose("b"),
         [lent("a", None), lent("b", NOW - 9)], False),
        ("nothing chosen", {"gpu": 1}, [], [lent("a", NOW - 10)], False),
    ],
)
def test_fairgate_evicts_for_inference_only_where_the_scheduler_takes_the_same_pod(
        case: str, demand: dict[str, int], chosen: list[Victim], borrowed: list[GpuPod],
        certain: bool) -> None:
    assert as_the_scheduler_would(demand, chosen, {p.ticket: p for p in borrowed}) is certain, \
        case


@pytest.mark.parametrize(
    ("case", "since", "victims", "expected"),
    [
        ("the head has not waited `after`: then", NOW - 60, [pod("a")], NOW - 60 + 300),
        ("`after` reached, a victim short of `minRuntime`: when it reaches it", NOW - 600,
         [pod("a", started=NOW - 600), pod("b", started=NOW - 1200)], NOW - 1200 + 1800),
        ("all have run `minRuntime`: time changes nothing", NOW - 600, [pod("a")], None),
        ("a pod not labelled preemptible never will", NOW - 600,
         [pod("a", started=NOW - 60, preemptible=False)], None),
        ("the owed tenant's own pods do not count", NOW - 600,
         [pod("a", tenant="new", started=NOW - 60)], None),
    ],
)
def test_the_next_check_is_due_when_time_alone_may_allow_a_reclaim(
        case: str, since: float, victims: list[Victim], expected: float | None) -> None:
    owed = Owed("new", {"gpu": 8}, {"gpu": 8}, since)
    assert due(owed, victims, SPEC, NOW) == expected, case


def test_heads_in_turn_each_get_what_choose_gives_them_after_the_reclaims_before() -> None:
    """16 GPUs of "old"'s 1-GPU pods, "new" (equal weight) with ten 1-GPU heads: one
    victim each for the first 8 (new then holds its entitlement: the 9th is refused and
    the 10th is not looked at), each the youngest left; Φ falls with each; with
    perHour 3, three heads are served."""
    spec = ReclaimSpec.model_validate({"after": "5m", "minRuntime": "30m", "perHour": 100})
    victims = [pod(f"p{i}", gpus=1, started=LONG_AGO + i) for i in range(16)]
    heads = [(f"h{i}", Owed("new", {"gpu": 1}, {"gpu": 1}, NOW - 600)) for i in range(10)]
    looked: list[str] = []

    def read() -> Iterator[tuple[str, Owed]]:
        for label, owed in heads:
            looked.append(label)
            yield label, owed

    standings = {"old": Standing(16, 8), "new": Standing(0, 8)}
    turns = choose_in_turn(read(), standings, victims, spec, NOW, [])
    assert [(label, keys(chosen)) for label, chosen in turns] == [
        (f"h{i}", [f"p{15 - i}"]) for i in range(8)]
    assert looked == [f"h{i}" for i in range(9)]
    phi = potential(standings)
    for i in range(1, 9):
        after = {"old": Standing(16 - i, 8), "new": Standing(i, 8)}
        assert potential(after) < phi
        phi = potential(after)
    few = ReclaimSpec.model_validate({"after": "5m", "minRuntime": "30m", "perHour": 3})
    assert len(choose_in_turn(heads, standings, victims, few, NOW, [])) == 3

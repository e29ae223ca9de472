"""bench/fairness.py's unkind generator (staggered joins, bursts into idle and busy
clusters, idle and return, big pods, uneven weights, inference over a training
backlog): each kind makes the situation it names, keeps every training tenant
backlogged throughout its all-active window whatever the order, and is measured over
that window with ``fairgate simulate``'s window measures; the summary counts pass
rates per target and per kind and names the worst seeds.

The targets themselves (GPU-time within 5% of the integrated entitlement, Jain >= 0.99,
utilisation >= 0.95, inference first) are met by the default order, virtual time, on
the first trace of each kind but two, whose pods of different sizes make the cluster
drain (``test_each_kind_meets_every_target``, strict xfail for those two, ``MISSED``
says why)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fairness import (
    INFERENCE_TENANT,
    KINDS,
    PODS_PER_ENTITLEMENT,
    WindowOutcome,
    check_window,
    main,
    unkind_trace,
    window_failures,
    window_summary,
    window_table,
)
from fairshare.localredis import local_redis
from fairshare.queue.entitlement import water_fill
from fairshare.sim.trace import parse_trace

MISSED = {  # the first trace of these kinds misses a target, and why
    "staggered": "12 GPUs drained for 4-GPU pods while every waiting pod is expected to "
                 "run longer than the drain, so none is backfilled: utilisation 0.92, "
                 "every tenant 7-9% short of an entitlement that assumes every GPU used",
    "big-pods": "backfill keeps utilisation at 1.0 while the cluster drains for the "
                "whole-cluster pods (0.72 without), but the weight-1 tenant of 1-GPU "
                "pods, the only one whose pods fit a drain, ends 5.9% over its "
                "entitlement (Jain's index 0.9989)",
}


def starts(data: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, the (at, every) of its training arrivals."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for arrival in data["arrivals"]:
        if arrival["class"] == "training":
            out[arrival["tenant"]].append((arrival["at"], arrival.get("every", 0)))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_every_trace_is_valid_and_its_window_covers_enough_pods(seed: int) -> None:
    data = unkind_trace(seed)
    meta = data["_meta"]
    assert meta["kind"] == KINDS[seed % len(KINDS)]
    trace = parse_trace({k: v for k, v in data.items() if k != "_meta"})  # valid
    start, end = meta["window"]
    assert end == trace.horizon and 0 <= start < end
    assert start == max(at for arrivals in starts(data).values() for at, _ in arrivals)
    capacity = trace.capacity["gpu"]
    inference = [a for a in data["arrivals"] if a["class"] == "inference"]
    training = capacity - max((a["demand"]["gpu"] for a in inference), default=0)
    weights = {n: trace.tenants[n].weight for n in meta["sizes"]}
    assert max(weights.values()) <= 8 * min(weights.values())
    entitled = water_fill(training, weights, {})
    for name, size in meta["sizes"].items():
        longest = max(a["duration"] for a in data["arrivals"] if a["tenant"] == name)
        # quantisation: the window's entitlement covers PODS_PER_ENTITLEMENT longest pods
        assert (end - start) * entitled[name] >= PODS_PER_ENTITLEMENT * size * longest - 1e-6
        assert trace.tenants[name].nominal["gpu"] == capacity  # quota never binds


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_makes_its_situation(kind: str) -> None:
    for seed in range(20):
        data = unkind_trace(seed, kind)
        meta, arrivals = data["_meta"], starts(data)
        start = meta["window"][0]
        capacity = data["capacity"]["gpu"]
        first = {name: min(at for at, _ in mine) for name, mine in arrivals.items()}
        sizes = meta["sizes"]
        if kind == "staggered":  # each joins later than the one before
            joins = sorted(first.values())
            assert len(set(joins)) == len(joins) >= 2 and joins[-1] == start
        elif kind in ("burst-idle", "burst-busy"):
            late = [n for n, at in first.items() if at == start]
            for name in late:  # a burst: pods at one instant, more than fit at once
                burst = [a for a in data["arrivals"] if a["tenant"] == name
                         and a["at"] == start and a.get("every", 0) == 0]
                assert sum(a["count"] for a in burst) > capacity // sizes[name]
            if kind == "burst-idle":  # into an idle cluster: nothing before
                assert set(first.values()) == {start}
            else:  # into a busy one: others backlogged from t=0
                assert start > 0 and min(first.values()) == 0 and len(late) < len(first)
        elif kind == "idle-return":
            back = [n for n, mine in arrivals.items() if {at for at, _ in mine} == {0, start}]
            assert back and start >= 3600
            for name in back:  # a little work at 0, then nothing until its return
                early = sum(a["count"] for a in data["arrivals"]
                            if a["tenant"] == name and a["at"] == 0)
                assert early <= 3 * capacity // sizes[name]
        elif kind == "big-pods":
            assert sizes["t0"] >= capacity // 2
            assert all(size <= 2 for name, size in sizes.items() if name != "t0")
        elif kind == "uneven-weights":
            weights = {n: float(data["tenants"][n]["weight"]) for n in sizes}
            entitled = water_fill(capacity, weights, {})
            assert any(entitled[n] % sizes[n] > 1e-9 for n in sizes)  # not whole pods
            assert max(weights.values()) >= 4 * min(weights.values())
        elif kind == "inference":
            assert INFERENCE_TENANT in data["tenants"]
            served = [a for a in data["arrivals"] if a["class"] == "inference"]
            assert len(served) == 1 and served[0]["count"] >= 1
            assert served[0]["demand"]["gpu"] == max(sizes.values())


def _outcome(seed: int, kind: str, error: float, jain: float = 1.0, util: float = 1.0,
             waited: int = 0, inference: bool = False, idle: float = 0.0,
             held: float = 0.0) -> WindowOutcome:
    """t0 ``error`` over and t1 under an entitlement of 100 GPU-seconds each, both also
    short by the fraction ``idle``; ``held``: capacity held idle for drains."""
    ratios = {"t0": (1 + error) * (1 - idle), "t1": (1 - error) * (1 - idle)}
    return WindowOutcome(seed=seed, kind=kind, tenants=2, capacity=8, window=[0.0, 1.0],
                         share_error=max(abs(r - 1) for r in ratios.values()), jain=jain,
                         utilization=util, inference_waited=waited,
                         has_inference=inference, backlogged=True, seconds=0.0,
                         held_idle=held,
                         per_tenant={n: {"of_entitlement": r, "gpu_seconds": 100 * r,
                                         "entitled_gpu_seconds": 100.0}
                                     for n, r in ratios.items()})


def test_the_summary_counts_pass_rates_per_target_and_kind_and_names_the_worst() -> None:
    outcomes = [
        _outcome(0, "staggered", 0.01),
        _outcome(7, "staggered", 0.30, jain=0.95),
        _outcome(1, "burst-idle", 0.08, util=0.90),
        _outcome(6, "inference", 0.02, waited=2, inference=True),
        _outcome(13, "inference", 0.0, inference=True),
    ]
    summary = window_summary(outcomes, worst=2)
    assert summary["all"]["traces"] == 5 and summary["all"]["pass"] == 2
    assert summary["all"]["share vs integrated entitlement"] == [3, 5]
    assert summary["all"]["utilisation while backlogged"] == [4, 5]
    assert summary["all"]["inference first (pods that waited)"] == [1, 2]  # of 2 with it
    assert summary["kinds"]["staggered"]["share vs integrated entitlement"] == [1, 2]
    assert [c["seed"] for c in summary["worst"]["share vs integrated entitlement"]] == [7, 1]
    assert summary["failed_seeds"] == [1, 6, 7]
    assert "share error 0.300 > 0.05 (t0: 1.300 of its entitlement)" in window_failures(
        outcomes[1])
    table = window_table(summary, "replay {seed}")
    assert "| staggered | 2 | 1/2 (50%) | 1/2 (50%) |" in table
    assert "seed 7 (staggered): share error 0.300" in table and "[replay 7]" in table


def test_idle_capacity_is_counted_once_in_the_share_of_the_gpu_time_used() -> None:
    """Both tenants 10% short because the cluster idled: the share error against the
    integrated entitlement is 10%, the share of what was used is exact; a tenant over
    its share by 8% stays 8% over however much idled."""
    even, uneven = _outcome(0, "big-pods", 0.0, idle=0.1), _outcome(7, "big-pods", 0.08,
                                                                     idle=0.1)
    assert even.share_error == pytest.approx(0.1) and even.used_share_error == 0.0
    assert uneven.used_share_error == pytest.approx(0.08)
    summary = window_summary([even, uneven])
    assert summary["all"]["used_share"] == 1
    assert summary["all"]["used_jain"] == 2  # shares 1.08 and 0.92: Jain 0.9936
    assert "big-pods 1/2 and 2/2, all 1/2 and 2/2" in window_table(summary, "replay {seed}")


def test_the_idle_held_for_drains_is_reported_by_trace() -> None:
    """Every trace below 0.95 utilisation is listed with the capacity held idle for
    drains, and the summary says how much of their idle that was."""
    outcomes = [_outcome(3, "big-pods", 0.0, util=0.90, held=0.08),
                _outcome(5, "staggered", 0.0, util=0.96, held=0.04),
                _outcome(1, "staggered", 0.0, util=0.80, held=0.02)]
    summary = window_summary(outcomes)
    assert summary["utilization_misses"] == [
        {"seed": 1, "kind": "staggered", "utilization": 0.8, "held_idle": 0.02},
        {"seed": 3, "kind": "big-pods", "utilization": 0.9, "held_idle": 0.08}]
    table = window_table(summary, "replay {seed}")
    assert ("utilisation below 0.95 in 2 trace(s); of their idle capacity 33% was held "
            "for drains. By trace (seed: utilisation / held idle): 1: 0.800 / 0.020, "
            "3: 0.900 / 0.080") in table
    assert "utilisation 0.900 < 0.95 (held idle for drains 0.080)" in window_failures(
        outcomes[0])


AHEAD_TRACE: dict[str, Any] = {
    "capacity": {"gpu": 4},
    "tenants": {n: {"weight": 1, "nominal": {"gpu": 4}} for n in ("t0", "t1", "t2")},
    "arrivals": [{"at": at, "tenant": name, "class": "training", "demand": {"gpu": 1},
                  "duration": 400, "count": 60}
                 for name, at in (("t0", 0), ("t1", 500), ("t2", 1000))],
    "horizon": 5000,
    "_meta": {"seed": 0, "kind": "staggered", "window": [1000, 5000],
              "sizes": {"t0": 1, "t1": 1, "t2": 1},
              "mean_durations": {"t0": 400, "t1": 400, "t2": 400}},
}


def test_a_tenant_that_enters_the_window_ahead_is_judged_from_its_own_join(
        redis_url: str) -> None:
    """t0 ran alone, then its 400-s pods outlasted t1's join: it enters the window (from
    t2's join) ahead and repays inside it, 10% short over the window. Judged from its
    own join (docs/fairness.md), it is within 2%; the others are judged over the window."""
    outcome = check_window(AHEAD_TRACE, redis.Redis.from_url(redis_url))
    t0, t1 = outcome.per_tenant["t0"], outcome.per_tenant["t1"]
    assert (t0["judged_from"], t1["judged_from"]) == (0.0, 1000.0)
    assert t0["of_entitlement"] == pytest.approx(0.9)
    assert t0["judged_share"] == pytest.approx(0.984, abs=1e-3)
    assert outcome.used_share_error == pytest.approx(0.05)
    assert outcome.used_jain > outcome.jain  # t0's 10% shortfall over the window is gone


def test_a_tenant_back_from_idle_is_judged_from_its_return(redis_url: str) -> None:
    """t1 took the whole cluster at 0 s (t0 came 1 s later), went idle and came back at
    3,000 s, when the window starts: it enters the window ahead of its entitlement, but
    its own join is its return (its lead was not carried over the idle time), so it is
    judged over the window, not from 0 s."""
    trace = {**AHEAD_TRACE, "tenants": {n: {"weight": 1, "nominal": {"gpu": 4}}
                                        for n in ("t0", "t1")},
             "arrivals": [
                 {"at": 1, "tenant": "t0", "class": "training", "demand": {"gpu": 1},
                  "duration": 400, "count": 100},
                 {"at": 0, "tenant": "t1", "class": "training", "demand": {"gpu": 1},
                  "duration": 400, "count": 4},
                 {"at": 3000, "tenant": "t1", "class": "training", "demand": {"gpu": 1},
                  "duration": 400, "count": 60}],
             "_meta": {**AHEAD_TRACE["_meta"], "window": [3000, 5000],
                       "sizes": {"t0": 1, "t1": 1},
                       "mean_durations": {"t0": 400, "t1": 400}}}
    outcome = check_window(trace, redis.Redis.from_url(redis_url))
    assert outcome.per_tenant["t1"]["judged_from"] == 3000.0
    assert outcome.per_tenant["t0"]["judged_from"] == 3000.0


@pytest.fixture(scope="module")
def measured() -> Iterator[Callable[[str], WindowOutcome]]:
    """The outcome of each kind's first seed, run once for the tests below."""
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        outcomes: dict[str, WindowOutcome] = {}

        def measure(kind: str) -> WindowOutcome:
            if kind not in outcomes:
                outcomes[kind] = check_window(unkind_trace(KINDS.index(kind), kind), client)
            return outcomes[kind]

        yield measure
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_tenant_stays_backlogged_throughout_its_window(
        measured: Callable[[str], WindowOutcome], kind: str) -> None:
    """The generator's promise holds whatever the order (here: today's)."""
    o = measured(kind)
    assert o.backlogged, o.per_tenant
    assert o.window[1] - o.window[0] > 3 * 3600 - 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", [
    pytest.param(kind, marks=pytest.mark.xfail(strict=True, reason=MISSED[kind]))
    if kind in MISSED else kind for kind in KINDS])
def test_each_kind_meets_every_target(measured: Callable[[str], WindowOutcome],
                                      kind: str) -> None:
    assert not window_failures(measured(kind))


@pytest.mark.slow
def test_the_command_line_runs_unkind_traces_and_prints_the_summary(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--unkind", "--kind", "burst-idle", "--traces", "1", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "seed 1 burst-idle:" in out
    assert "| burst-idle | 1 |" in out and "| all | 1 |" in out
    assert "every training tenant was backlogged throughout its window" in out


def test_kind_and_half_life_need_unkind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--kind", "big-pods"])
    assert exit_info.value.code == 2
    assert "--kind, --half-life and --declared go with --unkind" in capsys.readouterr().err


def measure_seed(seed: int, kind: str) -> WindowOutcome:
    """The outcome of the unkind trace of ``seed``, which must be of ``kind``."""
    data = unkind_trace(seed)
    assert data["_meta"]["kind"] == kind
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        try:
            return check_window(data, client)
        finally:
            client.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [58, 65])
def test_a_running_pod_is_charged_once_so_long_pods_are_not_held_back(seed: int) -> None:
    """Bursts into a busy cluster by tenants whose pods run 6 to 13 minutes: when a
    running pod counted both its expected run time up front and its elapsed time, the
    tenants with the longest pods fell 7.4% and 8.3% short of their entitlement over the
    window (utilisation 0.94-0.95); charged once, start-time fair queuing's start tag,
    every target is met."""
    outcome = measure_seed(seed, "burst-busy")
    assert not window_failures(outcome), outcome.per_tenant


@pytest.mark.slow
def test_inference_ahead_of_training_is_not_counted_against_the_training_tenants() -> None:
    """Inference goes first: a weight-1 tenant serving 2 GPUs of 12 is entitled to them,
    and the training tenants to the other 10 by weight. Entitled by weight alone (0.86
    GPUs to inference), all three training tenants looked 5-6% short of an entitlement
    to GPUs that inference held, at utilisation 0.99."""
    outcome = measure_seed(41, "inference")
    assert outcome.inference_waited == 0
    assert not window_failures(outcome), outcome.per_tenant



def test_declared_run_times_go_with_unkind_and_are_every_training_pods_duration(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--declared"])
    assert exit_info.value.code == 2
    assert "--declared go with --unkind" in capsys.readouterr().err
    trace = unkind_trace(3, declared=True)
    training = [a for a in trace["arrivals"] if a["class"] == "training"]
    assert training and all(a["activeDeadlineSeconds"] == math.ceil(a["duration"])
                            for a in training)
    assert all("activeDeadlineSeconds" not in a for a in unkind_trace(3)["arrivals"])

"""``fairgate simulate`` plays an autoscaler (trace key ``autoscaling: {maxCapacity,
provisionSeconds}``): the real dispatcher makes its requests, in queue order and within
``maxCapacity``; the nodes arrive ``provisionSeconds`` later; ``--json`` reports
``autoscaling: {requests, provisioned_gpus, wait_seconds: {p50, max}}``."""

from __future__ import annotations

from typing import Any

import pytest

from fairshare.sim.simulate import run_simulation
from fairshare.sim.trace import parse_trace
from tenants.schema import ConfigError


def _trace(arrivals: list[dict[str, Any]], autoscaling: dict[str, Any] | None,
           **tenants: dict[str, Any]) -> dict[str, Any]:
    trace: dict[str, Any] = {
        "capacity": {"gpu": 2},
        "tenants": tenants or {"team-a": {"weight": 1, "nominal": {"gpu": 8}}},
        "arrivals": arrivals, "horizon": 5000}
    if autoscaling is not None:
        trace["autoscaling"] = autoscaling
    return trace


def _pods(tenant: str, count: int, at: float = 0, **more: Any) -> dict[str, Any]:
    return {"at": at, "tenant": tenant, "class": "training", "demand": {"gpu": 2},
            "duration": 1000, "count": count, **more}


def _run(trace: dict[str, Any], redis_url: str) -> dict[str, Any]:
    report: dict[str, Any] = run_simulation(parse_trace(trace), redis_url).to_json()
    return report


def test_pods_beyond_the_nodes_run_once_their_nodes_arrive(redis_url: str) -> None:
    """Four 2-GPU pods on 2 GPUs, pools up to 8: one runs at once, three get a request
    each (inFlight 4 by default) and start provisionSeconds later."""
    report = _run(_trace([_pods("team-a", 4)], {"maxCapacity": {"gpu": 8},
                                                "provisionSeconds": 120}), redis_url)
    assert report["autoscaling"] == {"requests": 3, "provisioned_gpus": 6.0,
                                     "wait_seconds": {"p50": 120.0, "max": 120.0}}
    assert report["wait_seconds"]["training"]["max"] == 120.0
    assert report["tenants"]["team-a"]["admitted"] == 4


def test_nothing_is_requested_past_max_capacity(redis_url: str) -> None:
    """Pools up to 4 GPUs: one request (2 GPUs); the other pods wait for pods to end."""
    report = _run(_trace([_pods("team-a", 4)], {"maxCapacity": {"gpu": 4},
                                                "provisionSeconds": 60}), redis_url)
    assert report["autoscaling"]["requests"] == 1
    assert report["autoscaling"]["provisioned_gpus"] == 2.0
    assert report["wait_seconds"]["training"]["max"] == 1060.0  # a1 ended at 60 + 1000


def test_the_pools_never_grow_past_max_capacity(redis_url: str) -> None:
    """Streams of pods and gangs that end while requests are on their way: what arrives
    stops at maxCapacity (48 GPUs, 8 there already), however many requests come due."""
    tenants = {"team-a": {"weight": 2, "nominal": {"gpu": 32}},
               "team-b": {"weight": 1, "nominal": {"gpu": 32}}}
    arrivals = [_pods("team-a", 30, every=10, duration=1800),
                {**_pods("team-b", 10, every=30, duration=1800, group="ddp", groupSize=2),
                 "demand": {"gpu": 4}}]
    trace = {**_trace(arrivals, {"maxCapacity": {"gpu": 48}, "provisionSeconds": 300},
                      **tenants), "capacity": {"gpu": 8}, "horizon": 7200}
    report = _run(trace, redis_url)
    assert report["autoscaling"]["requests"] > 10
    assert report["autoscaling"]["provisioned_gpus"] == 40.0


def test_a_gang_is_one_request_for_all_of_it(redis_url: str) -> None:
    gang = _pods("team-a", 1, group="ddp", groupSize=3)
    report = _run(_trace([gang], {"maxCapacity": {"gpu": 8}, "provisionSeconds": 30}),
                  redis_url)
    assert report["autoscaling"] == {"requests": 1, "provisioned_gpus": 6.0,
                                     "wait_seconds": {"p50": 30.0, "max": 30.0}}


def test_two_tenants_get_nodes_in_weighted_fair_order(redis_url: str) -> None:
    """team-a (weight 2) runs one pod; it queues 6 more and team-b (weight 1) 6, every
    pod longer than the run; the pools have room for 3 more pods: they are requested in
    fair order (team-b gets its part, 1 or 2 of them), not first come, first served."""
    tenants = {"team-a": {"weight": 2, "nominal": {"gpu": 16}},
               "team-b": {"weight": 1, "nominal": {"gpu": 16}}}
    arrivals = [_pods("team-a", 1, duration=10_000), _pods("team-a", 6, at=1, duration=10_000),
                _pods("team-b", 6, at=1, duration=10_000)]
    report = _run(_trace(arrivals, {"maxCapacity": {"gpu": 8}, "provisionSeconds": 60},
                         **tenants), redis_url)
    assert report["autoscaling"]["requests"] == 3
    admitted = {name: t["admitted"] for name, t in report["tenants"].items()}
    assert sum(admitted.values()) == 4 and admitted["team-b"] in (1, 2), admitted


def test_without_autoscaling_nothing_is_requested(redis_url: str) -> None:
    report = _run(_trace([_pods("team-a", 4)], None), redis_url)
    assert report["autoscaling"] == {"requests": 0, "provisioned_gpus": 0.0,
                                     "wait_seconds": {"p50": 0.0, "max": 0.0}}
    assert report["tenants"]["team-a"]["waiting"] == 0  # they ran, one after the other
    assert report["wait_seconds"]["training"]["max"] == 3000.0


@pytest.mark.parametrize(("autoscaling", "said"), [
    ({"maxCapacity": {"gpu": 8}}, "autoscaling.provisionSeconds"),
    ({"maxCapacity": {"gpu": 8}, "provisionSeconds": -1}, "autoscaling.provisionSeconds"),
    ({"maxCapacity": {"gpu": 8}, "provisionSeconds": 5, "inFlight": 2},
     "autoscaling.inFlight"),
    ({"maxCapacity": {"tpu": 8}, "provisionSeconds": 5}, "autoscaling.maxCapacity"),
])
def test_a_wrong_autoscaling_key_is_named(autoscaling: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trace(_trace([_pods("team-a", 1)], autoscaling))
    assert said in str(caught.value), str(caught.value)

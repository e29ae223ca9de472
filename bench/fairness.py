"""Benchmark: weighted fairness under sustained contention, over random traces.

    python bench/fairness.py --traces 1000 --json fairness.json   # the 1,000-trace run
    python bench/fairness.py --traces 20 --seed 7                  # a quick look

Each trace runs through ``fairgate simulate``'s engine (the real Lua queue in a real
redis-server, the real dispatcher, the simulated cluster) and is checked against
DESIGN.md invariant 3 (see :func:`check`). Random traces (:func:`random_trace`): one
resource per trace, whole GPUs (16-32) or ``mig-1g.5gb`` slices (28-56); 2-6 training
tenants, weights 1-5, each with one pod size from {1, 2, 4, 8} units and pods of
durations 60-900 s (five streams per tenant, each with its own duration); every tenant's
pods arrive at twice the rate its entitlement could serve, so every tenant stays
backlogged for the whole horizon. Nominal quotas cover the cluster (quota never binds:
only the weights decide). One extra tenant, ``serve``, sends a 1-unit inference pod
every 600 s (300 s long).

Two conditions make the share target reachable at all (fairshare/README.md, "What
fairness can be measured"), and the generator states them:
- the horizon is at least 20x the trace's mean duration *and* long enough for every
  tenant's entitlement to cover :data:`PODS_PER_ENTITLEMENT` of its pods (entitled
  GPU-time >= that many times its mean pod GPU-time): a tenant's GPU-time moves by
  whole pods, so with fewer pods one pod more or less is more than 5% of its share
  (weight 1 of 20 with 8-GPU pods on 32 GPUs is entitled to 1.6 GPUs: 4 pods in 20
  durations);
- ``fairShare.usageHalfLife`` is 4x the horizon: the queue equalises decayed usage
  per weight, so the GPU-time share over the horizon is what it equalises only when
  its history spans the horizon (usage at the start still counts 84% at the end).
  With a shorter half-life the share over any window of about a half-life is fair,
  but the excess a tenant took while the others' first pods arrived is forgotten
  before it is paid back.

The ``--json`` object has one entry per trace and the worst values over all of them;
the Markdown summary is what BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from fairshare.entitlement import water_fill
from fairshare.localredis import local_redis
from fairshare.simulate import Simulation
from fairshare.trace import Trace, parse_trace

SIZES = (1, 2, 4, 8)
INFERENCE_TENANT = "serve"
PODS_PER_ENTITLEMENT = 20  # each tenant's entitled GPU-time covers this many of its pods


@dataclass(frozen=True)
class Outcome:
    """One trace's measurements (shares are of training GPU-time over the horizon)."""

    seed: int
    resource: str
    tenants: int
    one_unit: bool  # every training pod asks for 1 unit
    share_error: float  # worst |share - entitlement| / entitlement over tenants
    jain: float  # Jain's index of share / weight (training tenants)
    utilization: float
    max_gap: float  # longest time a backlogged tenant saw none of its pods start
    gap_bound: float  # the bound of max_gap (see bound())
    inference_max_wait: float
    seconds: float  # wall time of the run


def bound(durations_max: float, tenants: int) -> float:
    """Longest a backlogged tenant may go without a pod starting: 2 x the longest pod
    duration x the number of tenants (fairshare/README.md, "Holding", derives it)."""
    return 2 * durations_max * tenants


def random_trace(seed: int) -> dict[str, Any]:
    """A random contention trace (see the module docstring)."""
    rng = random.Random(seed)
    resource = rng.choice(["gpu", "mig-1g.5gb"])
    capacity = rng.choice([16, 24, 32]) if resource == "gpu" else rng.choice([28, 42, 56])
    names = [f"t{i}" for i in range(rng.randint(2, 6))]
    weights = {name: rng.randint(1, 5) for name in names}
    sizes = {name: rng.choice(SIZES) for name in names}
    durations = {name: [rng.randint(60, 900) for _ in range(5)] for name in names}
    mean = sum(sum(d) for d in durations.values()) / (5 * len(names))
    longest = max(max(d) for d in durations.values())
    total_weight = sum(weights.values())
    # entitled units per tenant; the horizon covers PODS_PER_ENTITLEMENT pods of each
    entitled_units = {n: capacity * weights[n] / total_weight for n in names}
    horizon = math.ceil(max(
        20 * mean,
        *(PODS_PER_ENTITLEMENT * sizes[n] * sum(durations[n]) / 5 / entitled_units[n]
          for n in names),
    ))
    arrivals: list[dict[str, Any]] = []
    for name in names:
        entitled = entitled_units[name]
        for duration in durations[name]:
            # each of the 5 streams brings 2/5 of what the entitlement could serve
            rate = 2 * entitled / sizes[name] / duration / 5  # pods per second
            every = 1 / rate
            arrivals.append({
                "at": 0, "tenant": name, "class": "training",
                "demand": {resource: sizes[name]}, "duration": duration,
                "count": math.ceil(horizon / every) + 1, "every": round(every, 3),
            })
    arrivals.append({
        "at": 300, "tenant": INFERENCE_TENANT, "class": "inference",
        "demand": {resource: 1}, "duration": 300, "count": math.ceil(horizon / 600),
        "every": 600,
    })
    tenants: dict[str, Any] = {
        name: {"weight": weights[name], "nominal": {resource: capacity}} for name in names
    }
    tenants[INFERENCE_TENANT] = {"weight": 1, "nominal": {resource: 1}}
    return {
        "capacity": {resource: capacity},
        "tenants": tenants,
        "arrivals": arrivals,
        "horizon": horizon,
        "fairShare": {"usageHalfLife": f"{4 * horizon}s"},
        "_meta": {"seed": seed, "resource": resource, "longest": longest,
                  "one_unit": set(sizes.values()) == {1}},
    }


def check(data: dict[str, Any], client: redis.Redis) -> Outcome:
    """Run one trace and measure it."""
    meta = data["_meta"]
    trace: Trace = parse_trace({k: v for k, v in data.items() if k != "_meta"})
    client.flushall()
    started = time.perf_counter()
    sim = Simulation(trace, client, "fairgate:")
    sim.run()
    seconds = time.perf_counter() - started
    training = [n for n in trace.tenants if n != INFERENCE_TENANT]
    used = {n: sim.meter.used_seconds[n] for n in training}
    total = sum(used.values())
    weights = {n: trace.tenants[n].weight for n in training}
    capacity = float(sum(trace.capacity.values()))
    # entitlements by water-filling (nobody is capped: quotas cover the cluster and
    # every tenant stays backlogged), as fractions of the training GPU-time
    fair = water_fill(capacity, weights, {})
    entitled = {n: fair[n] / sum(fair.values()) for n in training}
    shares = {n: used[n] / total for n in training}
    error = max(abs(shares[n] - entitled[n]) / entitled[n] for n in training)
    xs = [shares[n] / weights[n] for n in training]
    jain = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
    starts: dict[str, list[float]] = {n: [0.0] for n in training}
    inference_wait = 0.0
    for record in sim.cluster.history.values():
        if record.spec.tenant == INFERENCE_TENANT:
            if record.released is not None:
                inference_wait = max(inference_wait, record.released - record.created)
            else:
                inference_wait = max(inference_wait, trace.horizon - record.created)
        elif record.started is not None:
            starts[record.spec.tenant].append(record.started)
    gap = 0.0
    for name in training:
        times = [*sorted(starts[name]), trace.horizon]
        gap = max(gap, max(b - a for a, b in itertools.pairwise(times)))
    return Outcome(
        seed=meta["seed"], resource=meta["resource"], tenants=len(training),
        one_unit=meta["one_unit"], share_error=error, jain=jain,
        utilization=sim.meter.utilization(), max_gap=gap,
        gap_bound=bound(meta["longest"], len(training)),
        inference_max_wait=inference_wait, seconds=seconds,
    )


def failures(o: Outcome) -> list[str]:
    """What an outcome violates (empty when it meets every target)."""
    problems = []
    if o.share_error > 0.05:
        problems.append(f"share error {o.share_error:.3f} > 0.05")
    if o.jain < 0.99:
        problems.append(f"Jain {o.jain:.4f} < 0.99")
    floor = 0.95 if o.one_unit else 0.85
    if o.utilization < floor:
        problems.append(f"utilisation {o.utilization:.3f} < {floor}")
    if o.max_gap > o.gap_bound:
        problems.append(f"a tenant waited {o.max_gap:.0f} s > bound {o.gap_bound:.0f} s")
    if o.inference_max_wait > 0:
        problems.append(f"an inference pod waited {o.inference_max_wait:.0f} s")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first trace")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    outcomes: list[Outcome] = []
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        for seed in range(args.seed, args.seed + args.traces):
            o = check(random_trace(seed), client)
            outcomes.append(o)
            bad = failures(o)
            print(f"seed {seed}: {o.tenants} tenants {o.resource} err {o.share_error:.4f} "
                  f"jain {o.jain:.4f} util {o.utilization:.3f} gap {o.max_gap:.0f}/"
                  f"{o.gap_bound:.0f} inf {o.inference_max_wait:.0f} {o.seconds:.1f}s"
                  + (f"  FAIL: {'; '.join(bad)}" if bad else ""), flush=True)
    single = [o for o in outcomes if o.one_unit]
    mixed = [o for o in outcomes if not o.one_unit]
    summary = {
        "traces": len(outcomes),
        "failed": sum(1 for o in outcomes if failures(o)),
        "worst_share_error": max(o.share_error for o in outcomes),
        "worst_jain": min(o.jain for o in outcomes),
        "lowest_utilization_one_unit_pods": min((o.utilization for o in single), default=None),
        "lowest_utilization_larger_pods": min((o.utilization for o in mixed), default=None),
        "worst_gap_over_bound": max(o.max_gap / o.gap_bound for o in outcomes),
        "inference_max_wait": max(o.inference_max_wait for o in outcomes),
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(
            {"summary": summary, "traces": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

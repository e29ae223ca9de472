"""The simulator on the example traces: the real queue and dispatcher on a virtual clock."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import redis

from fairshare.cluster.cluster import GpuPod, PodRef
from fairshare.sim.simulate import Simulation, quota_violations, run_simulation, simulate_command
from fairshare.sim.trace import load_trace, parse_trace
from tenants.models import PriorityBand
from tenants.schema import ConfigError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.slow
def test_weights_1_2_3_all_backlogged_converge_to_weighted_shares(redis_url: str) -> None:
    report = run_simulation(load_trace(EXAMPLES / "weights-1-2-3.yaml"), redis_url)
    assert report.jain_index >= 0.99
    shares = {name: t.share for name, t in report.tenants.items()}
    assert shares["team-a"] == pytest.approx(1 / 6, abs=0.02)
    assert shares["team-b"] == pytest.approx(2 / 6, abs=0.02)
    assert shares["team-c"] == pytest.approx(3 / 6, abs=0.02)
    assert all(t.waiting > 0 for t in report.tenants.values())  # backlogged to the end


@pytest.mark.slow
def test_inference_starts_within_a_second_over_a_full_training_backlog(redis_url: str) -> None:
    trace = load_trace(EXAMPLES / "inference-burst.yaml")
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:test:")
    sim.advance(1.0)
    queued = sum(s.queued["training"] for s in sim.queue.tenant_status())
    assert queued >= 1900  # 2,000 training pods, all but what fits queued
    report = sim.run()
    waits = report.wait_seconds["inference"]
    assert waits.p99 <= 1.0
    assert waits.max <= 1.0
    assert report.preemptions > 0  # inference got its room by preempting borrowed training
    inference = [h for h in sim.cluster.history.values() if h.spec.pod_class == "inference"]
    assert len(inference) >= 70 and all(h.started is not None for h in inference)


@pytest.mark.slow
def test_gangs_are_released_all_at_once_or_not_at_all(redis_url: str) -> None:
    trace = load_trace(EXAMPLES / "gangs.yaml")
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:test:")
    report = sim.run()
    assert report.gang_violations == []
    gangs: dict[tuple[str, str], list[float | None]] = {}
    for record in sim.cluster.history.values():
        if record.spec.group is not None:
            gangs.setdefault((record.spec.namespace, record.spec.group), []).append(
                record.released
            )
    released = [times for times in gangs.values() if times[0] is not None]
    assert len(released) >= 20  # the trace really releases gangs
    for times in gangs.values():
        assert len(set(times)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("example", ["weights-1-2-3.yaml", "mig-and-gpus.yaml"])
def test_capacity_stays_busy_while_pods_wait(redis_url: str, example: str) -> None:
    report = run_simulation(load_trace(EXAMPLES / example), redis_url)
    assert report.backlogged_utilization >= 0.95
    assert report.utilization >= 0.95


def test_mig_pods_do_not_wait_behind_whole_gpu_pods(redis_url: str) -> None:
    trace = parse_trace({
        "capacity": {"gpu": 2, "mig-1g.5gb": 7},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 2, "mig-1g.5gb": 7}}},
        "arrivals": [
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 100, "count": 10},
            {"at": 1, "tenant": "team-a", "class": "training", "demand": {"mig-1g.5gb": 1},
             "duration": 50, "count": 3},
        ],
        "horizon": 60,
    })
    report = run_simulation(trace, redis_url)
    sim_waits = report.wait_seconds["training"]
    assert sim_waits.max == pytest.approx(60.0)  # whole-GPU pods still waiting at the end
    assert report.tenants["team-a"].admitted == 2 + 3  # both GPUs and all three MIG pods


def test_a_backlog_beyond_nominal_and_borrow_limit_keeps_using_both(redis_url: str) -> None:
    """One tenant alone on 8 GPUs, nominal 4 and borrow limit 4, creates 40 pods at once:
    8 start (4 within nominal, 4 borrowed), and the 32 beyond both are stamped training
    or borrowed, by which band's queue drains first for its room, so when the first
    borrowed pods end more borrowed pods follow. Stamped training all (what the first
    pod of each band alone fits), the borrowed room stayed idle after the first wave:
    utilisation 0.6."""
    trace = parse_trace({
        "capacity": {"gpu": 8},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 4},
                               "borrowLimit": {"gpuEquivalents": 4}}},
        "arrivals": [{"at": 0, "tenant": "team-a", "class": "training",
                      "demand": {"gpu": 1}, "duration": 100, "count": 40}],
        "horizon": 500,
    })
    report = run_simulation(trace, redis_url)
    assert report.quota_violations == []
    assert report.utilization == pytest.approx(1.0)
    assert report.tenants["team-a"].admitted == 40


def test_json_output_has_exactly_the_designed_keys(redis_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.yaml"
    trace.write_text(
        "capacity: {gpu: 2}\n"
        "tenants:\n  team-a: {weight: 2, nominal: {gpu: 2}}\n"
        "  team-b: {weight: 1, nominal: {gpu: 2}}\n"
        "arrivals:\n"
        "  - {at: 0, tenant: team-a, class: training, demand: {gpu: 1}, duration: 10, count: 6}\n"
        "  - {at: 0, tenant: team-b, class: inference, demand: {gpu: 1}, duration: 5, count: 2}\n"
        "horizon: 100\n"
    )
    out = io.StringIO()
    assert simulate_command(trace, True, redis_url, out=out) == 0
    data = json.loads(out.getvalue())
    assert set(data) == {"jain_index", "utilization", "wait_seconds", "tenants", "preemption",
                         "reclaim", "waited", "window", "autoscaling", "gangs"}
    assert data["gangs"] == []  # a trace without gangs
    assert data["autoscaling"] == {"requests": 0, "provisioned_gpus": 0.0,
                                   "wait_seconds": {"p50": 0.0, "max": 0.0}}
    assert set(data["window"]) == {"from", "to", "utilization", "held_idle", "jain_index",
                                   "tenants"}
    assert set(data["window"]["tenants"]["team-b"]) == {
        "gpu_seconds", "gpu_seconds_by_class", "entitled_gpu_seconds", "of_entitlement",
        "backlogged_seconds"}
    assert data["window"]["tenants"]["team-b"]["gpu_seconds_by_class"] == {
        "inference": 2 * 5.0, "training": 0.0}
    assert data["waited"] == {"inference": 0, "training": 6}
    assert set(data["wait_seconds"]) == {"inference", "training"}
    assert set(data["wait_seconds"]["training"]) == {"p50", "p99", "max"}
    assert set(data["tenants"]["team-a"]) == {"weight", "share", "admitted", "waiting",
                                              "gpu_hours", "cost"}
    # no pricing in the trace: GPU hours, no cost; the preempted pods had run 0 s
    assert data["tenants"]["team-a"]["gpu_hours"] == round(6 * 10 / 3600, 4)
    assert data["tenants"]["team-b"]["gpu_hours"] == round(2 * 5 / 3600, 4)
    assert data["tenants"]["team-a"]["cost"] is None
    assert data["preemption"] == {"pods": 2, "gpu_hours_lost": 0.0}
    assert data["reclaim"] == {"pods": 0, "gpu_hours_lost": 0.0, "min_run_seconds": 0.0}
    # The 2 training pods that started first were preempted by inference at t=0 and
    # re-created by their controller: 6 + 2 pods released for team-a, which are the 6
    # pods it submitted, each counted once.
    assert data["tenants"]["team-a"]["admitted"] == 6
    assert data["tenants"]["team-a"]["waiting"] == 0
    assert data["tenants"]["team-b"]["admitted"] == 2
    assert 0 < data["utilization"] <= 1
    assert data["wait_seconds"]["inference"]["max"] == 0.0
    # then 6 training pods of 10 s on 2 GPUs from t=5: the last two start at 25 s
    assert data["wait_seconds"]["training"]["max"] == pytest.approx(25.0)
    assert sum(t["share"] for t in data["tenants"].values()) == pytest.approx(1.0, abs=1e-3)


def test_the_simulation_leaves_a_shared_redis_as_it_found_it(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("someone-else", "1")
    run_simulation(load_trace(EXAMPLES / "gangs.yaml").model_copy(update={"horizon": 50}),
                   redis_url)
    assert client.keys("*") == [b"someone-else"]


def test_a_bad_trace_names_the_field_and_exits_2(tmp_path: Path) -> None:
    trace = tmp_path / "bad.yaml"
    trace.write_text(
        "capacity: {gpu: 4}\ntenants: {team-a: {weight: 1}}\n"
        "arrivals:\n  - {at: 0, tenant: team-b, class: training, demand: {gpu: 1}, duration: 5}\n"
        "  - {at: 0, tenant: team-a, class: batch, demand: {gpu: 1}, duration: 5}\n"
        "horizon: 10\n"
    )
    err = io.StringIO()
    assert simulate_command(trace, True, None, out=io.StringIO(), err=err) == 2
    assert "arrivals.1.class" in err.getvalue()
    assert "'inference' or 'training'" in err.getvalue()


def test_trace_cross_checks_name_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_trace({
            "capacity": {"gpu": 4},
            "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 1},
                                   "inferenceReserve": {"gpuEquivalents": 2}},
                        "Team B": {"weight": 1}},
            "arrivals": [
                {"at": 0, "tenant": "team-x", "class": "training", "demand": {"gpu": 1},
                 "duration": 5},
                {"at": 0, "tenant": "team-a", "class": "training",
                 "demand": {"mig-1g.5gb": 1}, "duration": 5},
                {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
                 "duration": 5, "group": "my gang", "groupSize": 2},
            ],
            "horizon": 10,
        })
    fields = {p.field for p in caught.value.problems}
    assert fields == {"tenants.team-a.inferenceReserve.gpuEquivalents", "tenants.Team B",
                      "arrivals.0.tenant", "arrivals.1.demand", "arrivals.2.group"}


def test_streams_and_gangs_expand_into_pods() -> None:
    trace = parse_trace({
        "capacity": {"gpu": 4},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 4}}},
        "arrivals": [
            {"at": 5, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 5, "count": 3, "every": 2},
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 5, "count": 2, "every": 10, "group": "g", "groupSize": 2},
        ],
        "horizon": 10,
    })
    pods = trace.pods()
    assert [p.at for p in pods] == [0, 0, 5, 7, 9, 10, 10]
    assert [p.group for p in pods if p.group] == ["g-0", "g-0", "g-1", "g-1"]
    assert len({p.name for p in pods}) == len(pods)


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_quota_holds_after_every_event_of_every_example(redis_url: str, example: str) -> None:
    report = run_simulation(load_trace(EXAMPLES / example), redis_url)
    assert report.quota_violations == []
    assert report.gang_violations == []


def test_the_quota_check_sees_a_tenant_above_its_quota() -> None:
    trace = parse_trace({
        "capacity": {"gpu": 8},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 2},
                               "borrowLimit": {"gpuEquivalents": 1},
                               "inferenceReserve": {"gpuEquivalents": 1}}},
        "arrivals": [], "horizon": 1,
    })

    def pod(name: str, band: PriorityBand, gpus: int, gated: bool = False) -> GpuPod:
        return GpuPod(ref=PodRef("ns", name), uid=name, ticket=name, tenant="team-a",
                      pod_class="inference" if band == "inference" else "training",
                      band=band, demand={"gpu": gpus}, group=None, group_size=1,
                      phase="Running" if not gated else "Pending", gated=gated, node=None,
                      created=0.0)

    config = trace.config()
    fine = [pod("i", "inference", 1), pod("t", "training", 1), pod("b", "borrowed", 1),
            pod("waiting", "training", 5, gated=True)]
    assert quota_violations(config, fine) == []
    over = [pod("t1", "training", 2), pod("b1", "borrowed", 2)]
    assert quota_violations(config, over) == [
        "team-a: training 14 slices above nominal minus reserve",
        "team-a: training and borrowed 28 slices above nominal minus reserve plus borrowLimit",
        "team-a: 28 slices above nominal plus borrowLimit",
    ]
    # a borrowed pod may stand in the nominal room training leaves unused...
    assert quota_violations(config, [pod("b2", "borrowed", 2)]) == []
    # ...but not in the inference reserve
    assert quota_violations(config, [pod("b3", "borrowed", 3)]) == [
        "team-a: training and borrowed 21 slices above nominal minus reserve plus borrowLimit",
    ]
    assert quota_violations(config, [pod("i", "inference", 3)]) == [
        "team-a: gpu=3 above nominal 2"
    ]


def test_placement_example_keeps_every_class_within_its_own_capacity(redis_url: str) -> None:
    """examples/placement.yaml: whole GPUs never exceed the 8 plain GPUs (the 56
    single-strategy MIG devices are not whole GPUs), the pool tenant never holds more
    than its pool's 4 GPUs (borrowing included), and the single-MIG pods run."""
    trace = load_trace(EXAMPLES / "placement.yaml")
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:placement:")
    peak: dict[str, int] = {}
    mig_ran = 0
    for step in range(1, int(trace.horizon // 10) + 1):
        sim.advance(step * 10.0)
        running: dict[str, int] = {}
        for pod in sim.cluster.list_pods():
            if pod.holds_capacity:
                for key, n in pod.demand.items():
                    running[key] = running.get(key, 0) + n
                    assert pod.tenant != "team-pool" or key == "gpu@a100-pool"
                if "mig-1g.5gb#single" in pod.demand:
                    mig_ran += 1
        for key, n in running.items():
            assert n <= trace.capacity[key], (step, key, n)
            peak[key] = max(peak.get(key, 0), n)
    assert peak == {"gpu": 8, "gpu@a100-pool": 4, "mig-1g.5gb#single": peak["mig-1g.5gb#single"]}
    assert mig_ran > 0
    report = sim.run()
    assert report.quota_violations == []
    assert report.tenants["team-b"].waiting == 0


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"capacity": {"gpu#single": 4}}, "single-strategy nodes offer MIG devices"),
        ({"capacity": {"gpu@bad pool": 4}}, "not a Kubernetes label value"),
        ({"arrivals": [{"at": 0, "tenant": "t", "class": "training", "demand": {"gpu": 1},
                        "migProfile": "1g.5gb", "duration": 1}]},
         "mig-1g.5gb#single which 'capacity' does not have"),
        ({"arrivals": [{"at": 0, "tenant": "t", "class": "training",
                        "demand": {"mig-1g.5gb": 1}, "migProfile": "1g.5gb", "duration": 1}]},
         "request nvidia.com/gpu only"),
    ],
)
def test_trace_placement_errors_say_what_to_fix(change: dict[str, object], fragment: str) -> None:
    data: dict[str, object] = {
        "capacity": {"gpu": 4, "mig-1g.5gb": 7},
        "tenants": {"t": {"weight": 1, "nominal": {"gpu": 4, "mig-1g.5gb": 7}}},
        "arrivals": [{"at": 0, "tenant": "t", "class": "training", "demand": {"gpu": 1},
                      "duration": 1}],
        "horizon": 10,
    }
    data.update(change)
    with pytest.raises(ConfigError) as info:
        parse_trace(data)
    assert fragment in str(info.value)


def test_a_preempted_pod_is_counted_once(redis_url: str) -> None:
    """admitted + waiting is each tenant's pods submitted, however often its pods were
    preempted and re-created (a gang's members included), at the horizon as before it."""
    trace = load_trace(EXAMPLES / "preemption-cost.yaml")
    submitted: dict[str, int] = {}
    for pod in trace.pods():
        submitted[pod.tenant] = submitted.get(pod.tenant, 0) + 1
    for horizon in (trace.horizon, trace.horizon / 3):
        report = run_simulation(trace.model_copy(update={"horizon": horizon}), redis_url)
        assert report.preemptions > 0
        for name, tenant in report.tenants.items():
            arrived = sum(1 for pod in trace.pods() if pod.tenant == name and pod.at <= horizon)
            assert tenant.admitted + tenant.waiting <= arrived <= submitted[name], name
        research = report.tenants["research"]
        assert research.admitted + research.waiting == sum(
            1 for pod in trace.pods() if pod.tenant == "research" and pod.at <= horizon)


@pytest.mark.parametrize("lend", [True, False])
def test_a_kept_inference_reserve_is_never_borrowed_so_inference_preempts_nothing(
        redis_url: str, lend: bool) -> None:
    """8 GPUs: team-a's training backlog may borrow team-b's 4 idle GPUs; team-b serves a
    1-GPU inference pod now and then, within its reserve of 1. Lent (the default), the
    reserve's GPU is borrowed and inference pods preempt borrowed pods; kept
    (`fairShare.lendInferenceReserve: false`), it stays free: no preemption, and team-a
    runs on 7 GPUs at most."""
    trace = parse_trace({
        "capacity": {"gpu": 8},
        "tenants": {
            "team-a": {"weight": 1, "nominal": {"gpu": 4}, "borrowLimit": {"gpuEquivalents": 4}},
            "team-b": {"weight": 1, "nominal": {"gpu": 4},
                       "inferenceReserve": {"gpuEquivalents": 1}},
        },
        "fairShare": {"lendInferenceReserve": lend},
        "arrivals": [
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 300, "count": 40},
            {"at": 60, "tenant": "team-b", "class": "inference", "demand": {"gpu": 1},
             "duration": 30, "count": 10, "every": 60},
        ],
        "horizon": 700,
    })
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:test:")
    most_a = 0
    for until in range(10, 700, 10):
        sim.advance(float(until))
        most_a = max(most_a, sum(1 for h in sim.cluster.history.values()
                                 if h.spec.tenant == "team-a" and h.started is not None
                                 and h.ended is None))
    report = sim.run()
    assert report.wait_seconds["inference"].max <= 1.0
    if lend:
        assert report.preemptions > 0 and most_a == 8
    else:
        assert report.preemptions == 0 and most_a == 7

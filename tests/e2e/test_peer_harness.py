"""The peer comparison's parts that need no Kueue build: which tests `python -m pytest`
runs, the Kueue manifests the harness installs (from the Kueue module itself, downloaded
without building it), and bench/peer_kueue.py's scenarios and arithmetic.

The run against Kueue itself is test_kueue_peer.py (`python -m pytest -m peer`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness.kubelet import whole_gpu_node
from harness.kueue import NAMESPACE, SERVICE, TENANT_LABEL, Tenant, build_kueue, crds
from harness.kueue import webhook_configurations as kueue_webhooks

from tenants.models import PREEMPTIBLE_LABEL
from tenants.schema import parse_platform, parse_quota

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_kueue

REPO = Path(__file__).resolve().parents[2]
PEER_TESTS = "tests/e2e/test_kueue_peer.py"


@pytest.mark.parametrize("marks", [[], ["-m", "e2e"], ["-m", "not slow"]])
def test_the_test_command_leaves_the_peer_tests_out(marks: list[str]) -> None:
    """`python -m pytest` (the README's and CI's command), with or without a `-m` of its
    own, deselects the tests that need Kueue; being deselected, they build nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *marks, PEER_TESTS],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    output = result.stdout + result.stderr
    assert "3 deselected" in output, output
    assert "test_kueue_peer.py::" not in output, output
    assert "[controlplane" not in output, output  # no e2e test left: nothing is built


@pytest.mark.e2e
def test_the_kueue_manifests_route_pods_and_kueues_objects_to_its_service() -> None:
    """From Kueue's module (config/components, no build): only the Pod webhooks and those
    for Kueue's own objects are installed, routed to `kueue-webhook-service` in
    `kueue-system`, the Pod webhooks limited to tenant namespaces; the CRDs that Kueue's
    kustomization gives a conversion webhook get it, routed the same way."""
    config = build_kueue(config_only=True) / "config"

    configurations = kueue_webhooks(config)
    hooks = {c["metadata"]["name"]: sorted(h["name"] for h in c["webhooks"])
             for c in configurations}
    assert hooks == {
        "kueue-mutating-webhook-configuration": [
            "mclusterqueue.kb.io", "mpod.kb.io", "mresourceflavor.kb.io", "mworkload.kb.io"],
        "kueue-validating-webhook-configuration": [
            "vclusterqueue.kb.io", "vcohort.kb.io", "vpod.kb.io", "vresourceflavor.kb.io",
            "vworkload.kb.io"],
    }
    for configuration in configurations:
        for hook in configuration["webhooks"]:
            service = hook["clientConfig"]["service"]
            assert (service["name"], service["namespace"]) == (SERVICE, NAMESPACE), hook
            if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                assert hook["namespaceSelector"] == {
                    "matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}

    definitions = {c["metadata"]["name"]: c for c in crds(config)}
    assert "resourceflavors.kueue.x-k8s.io" in definitions
    converted = sorted(name for name, crd in definitions.items() if "conversion" in crd["spec"])
    assert converted == [f"{kind}.kueue.x-k8s.io" for kind in (
        "clusterqueues", "cohorts", "localqueues", "multikueueclusters", "workloads")]
    for name in converted:
        webhook = definitions[name]["spec"]["conversion"]["webhook"]
        assert webhook["clientConfig"]["service"] == {
            "name": SERVICE, "namespace": NAMESPACE, "path": "/convert"}


def test_each_fairness_scenario_measures_30_pod_lengths_of_backlogs() -> None:
    """Where tenants' shares are compared (two backlogs or more), the window from the last
    backlog's first pod to the horizon spans at least 30 of the longest pods (the span
    fairness is defined over), and no backlog could drain before the horizon, even given
    the whole cluster until the last backlog starts and its entitlement afterwards: every
    tenant stays backlogged to the end."""
    compared = 0
    for scenario in peer_kueue.scenarios().values():
        backlogs = [s for s in scenario.streams if not s.inference]
        if len({s.tenant for s in backlogs}) < 2 or scenario.reclaim:
            continue  # the reclaim rows: test_the_reclaim_scenarios_are_the_traces_they_say
        compared += 1
        last_start = max(s.at for s in backlogs)
        window = scenario.horizon - last_start
        assert window >= 30 * max(s.duration for s in backlogs), scenario.name
        weights = {t.name: t.weight for t in scenario.tenants}
        for stream in backlogs:
            entitled = scenario.capacity * weights[stream.tenant] / sum(
                weights[s.tenant] for s in backlogs)
            most = scenario.capacity * (last_start - stream.at) + entitled * window
            assert stream.count * stream.gpus * stream.duration > most, (scenario.name, stream)
    assert compared == 4


def test_measure_counts_gpu_time_within_the_shared_window() -> None:
    """8 GPUs, two equal tenants; team-b's backlog starts at 2 s, so GPU-time before 2 s is
    not counted; a pod still running at the end counts up to the end; a pod that ended
    without being finished by the bench was preempted; inference waits are create to
    Running."""
    scenario = peer_kueue.Scenario(
        "hand", (whole_gpu_node("gpu-0", 8),),
        (Tenant("team-a", 1, 4), Tenant("team-b", 1, 4)),
        (peer_kueue.Stream("team-a", 0, 2, 8, 4), peer_kueue.Stream("team-b", 2, 2, 4, 4),
         peer_kueue.Stream("team-b", 5, 1, 1, 1, inference=True)),
        horizon=10,
    )
    record = peer_kueue.PodRecord
    records = [
        record("team-a", 8, 4, False, created=0, running=0, ended=4, finish_asked=True),
        record("team-b", 4, 4, False, created=2, running=4, ended=8, finish_asked=True),
        record("team-b", 4, 4, False, created=2, running=4, ended=6),  # preempted at 6
        record("team-a", 4, 4, False, created=0, running=6, ended=None),
        record("team-b", 1, 1, True, created=5, running=5.25, ended=6.25, finish_asked=True),
        record("team-a", 8, 4, False, created=0),  # never ran
    ]
    result = peer_kueue.measure(scenario, records, began=0, end=10)
    # from 2 s to 10 s: team-a 8 x 2 + 4 x 4 = 32, team-b 4 x 4 + 4 x 2 + 1 x 1 = 25
    assert result["window_s"] == 8
    assert result["shares"] == {"team-a": round(32 / 57, 4), "team-b": round(25 / 57, 4)}
    assert result["entitled"] == {"team-a": 0.5, "team-b": 0.5}
    assert result["utilisation"] == round(57 / (8 * 8), 4)
    assert result["jain"] == round(peer_kueue.jain([64 / 57, 50 / 57]), 4)
    assert result["preempted"] == 1
    assert result["pods_run"] == 5
    assert (result["inference_ran"], result["inference_p50_ms"]) == ("1/1", 250.0)


def _reclaim_spec(scenario: peer_kueue.Scenario) -> dict[str, float]:
    """The scenario's fairShare.reclaim as fairgate parses it (seconds, pods an hour)."""
    platform, _ = peer_kueue.fairgate_config(scenario.tenants, scenario.capacity, {},
                                             scenario.reclaim, scenario.whole_nominal)
    spec = parse_platform(platform).fair_share.reclaim
    assert spec is not None
    return {"after": spec.after, "min_runtime": spec.min_runtime, "per_hour": spec.per_hour}


def test_the_reclaim_scenarios_are_the_traces_they_say() -> None:
    """newcomer: team-a's preemptible 1-GPU pods fill the 16 GPUs, none ends within the
    run, team-b (equal weight) joins with a backlog once they have all run minRuntime, and
    fairgate can only give it GPUs by reclaim (every nominal the whole cluster);
    newcomer-borrowed is the same trace with the other rows' quotas, fairgate only, and
    newcomer-no-wait the same trace and quotas with reclaim's `after` at 0 (Kueue has no
    such wait), fairgate only. two-backlogged: both tenants are backlogged from the start
    (the first 16 creates alternate, 8 each), their pods turn over within the run, no
    backlog drains before the horizon even at 1.5 times its entitlement, and the settling
    time leaves most of the run."""
    by_name = peer_kueue.scenarios()
    assert {"newcomer", "newcomer-borrowed", "two-backlogged"} <= set(by_name)
    reclaiming = [s for s in by_name.values() if s.reclaim]
    assert sorted(s.name for s in reclaiming) == [
        "newcomer", "newcomer-borrowed", "newcomer-no-wait", "two-backlogged"]
    for scenario in reclaiming:
        assert scenario.capacity == 16
        assert [t.weight for t in scenario.tenants] == [1, 1]
        assert all(s.preemptible and s.gpus == 1 and not s.inference
                   for s in scenario.streams), scenario.name
        after = 0 if scenario.name == "newcomer-no-wait" else 5
        assert _reclaim_spec(scenario) == {"after": after, "min_runtime": 30, "per_hour": 720}
    no_wait = by_name["newcomer-no-wait"]
    assert (no_wait.streams, no_wait.nodes, no_wait.tenants, no_wait.whole_nominal,
            no_wait.systems) == (by_name["newcomer"].streams, by_name["newcomer"].nodes,
                                 by_name["newcomer"].tenants, True, ("fairgate",))

    newcomer, borrowed = by_name["newcomer"], by_name["newcomer-borrowed"]
    assert borrowed.streams == newcomer.streams and borrowed.nodes == newcomer.nodes
    assert (newcomer.whole_nominal, borrowed.whole_nominal) == (True, False)
    assert (newcomer.systems, borrowed.systems) == (peer_kueue.SYSTEMS, ("fairgate",))
    first, joiner = newcomer.streams
    assert (first.tenant, joiner.tenant) == ("team-a", "team-b")
    assert first.at == 0 and first.count * first.gpus == newcomer.capacity
    assert joiner.at >= _reclaim_spec(newcomer)["min_runtime"] + 10
    assert joiner.count * joiner.gpus >= newcomer.capacity / 2  # a backlog of its share
    assert min(s.duration for s in newcomer.streams) > 10 * newcomer.horizon
    assert newcomer.settle is None

    both = by_name["two-backlogged"]
    assert both.whole_nominal and both.settle is not None
    assert both.horizon - both.settle >= 0.8 * both.horizon
    order = sorted((s.at + i * s.every, s.tenant) for s in both.streams
                   for i in range(s.count))
    assert sorted(t for _, t in order[:both.capacity]) == ["team-a"] * 8 + ["team-b"] * 8
    for stream in both.streams:
        assert stream.at < 1
        assert 2 * stream.duration < both.horizon - both.settle  # pods turn over
        assert stream.duration >= 3 * _reclaim_spec(both)["min_runtime"]  # reclaimable
        # half as much again as its entitlement could run: still backlogged at the end
        assert stream.count * stream.gpus * stream.duration > 1.5 * 8 * both.horizon


def test_fairgate_config_of_a_run_is_valid_and_says_its_quotas() -> None:
    """The platform.yaml and quota.yaml the bench installs parse with fairgate's own
    schema: reclaim only where the scenario turns it on; nominal as Kueue's (raised to the
    largest pod) with the rest of the cluster as borrow limit, or the whole cluster."""
    tenants = (Tenant("team-a", 1, 4), Tenant("team-b", 2, 4))
    for reclaim, whole in (("", False), (peer_kueue.RECLAIM, False),
                           (peer_kueue.RECLAIM, True)):
        text, quotas = peer_kueue.fairgate_config(tenants, 8, {"team-a": 8, "team-b": 1},
                                                  reclaim, whole)
        platform = parse_platform(text)
        assert platform.tenants["team-b"].weight == 2
        assert (platform.fair_share.reclaim is not None) == bool(reclaim)
        for name, (nominal, borrow) in {"team-a": (8, 0),
                                        "team-b": (8, 0) if whole else (4, 4)}.items():
            quota = parse_quota(quotas[name], name, platform)
            assert quota.nominal == {"gpu": nominal}, (name, reclaim, whole)
            assert quota.borrow_limit.gpu_equivalents == borrow, (name, reclaim, whole)


def test_the_reserve_row_is_the_inference_trace_with_a_gpu_kept_for_inference() -> None:
    """inference-reserve: the inference trace, team-b keeping 1 of its 4 GPUs for its
    inference: fairgate's inferenceReserve 1, kept free of borrowed pods; the other rows
    lend every reserve (none is set)."""
    by_name = peer_kueue.scenarios()
    plain, kept = by_name["inference"], by_name["inference-reserve"]
    assert (kept.streams, kept.nodes, kept.systems) == (plain.streams, plain.nodes,
                                                         plain.systems)
    assert [(t.name, t.nominal, t.reserve) for t in kept.tenants] == [
        ("team-a", 4, 0), ("team-b", 4, 1)]
    text, quotas = peer_kueue.fairgate_config(kept.tenants, kept.capacity, {})
    platform = parse_platform(text)
    assert platform.fair_share.lend_inference_reserve is False
    assert parse_quota(quotas["team-b"], "team-b", platform).inference_reserve.gpu_equivalents == 1
    assert parse_quota(quotas["team-a"], "team-a", platform).inference_reserve.gpu_equivalents == 0
    for scenario in by_name.values():
        if scenario.name != "inference-reserve":
            text, _ = peer_kueue.fairgate_config(scenario.tenants, scenario.capacity, {},
                                                 scenario.reclaim, scenario.whole_nominal)
            assert parse_platform(text).fair_share.lend_inference_reserve, scenario.name


def test_a_preemptible_pod_is_labelled_for_fairgate_and_plain_for_kueue() -> None:
    """fairgate reads its label; Kueue gets no priority class for a training pod,
    preemptible or not: every tenant's pods have the same priority and fair sharing
    decides what Kueue preempts."""
    fairgate = peer_kueue.manifest("fairgate", "p", 1, 10.0, False, preemptible=True)
    assert fairgate["metadata"]["labels"] == {PREEMPTIBLE_LABEL: "true"}
    assert peer_kueue.manifest("fairgate", "p", 1, 10.0, False)["metadata"]["labels"] == {}
    kueue = peer_kueue.manifest("kueue", "p", 1, 10.0, False, preemptible=True)
    assert kueue["metadata"]["labels"] == {}
    assert "priorityClassName" not in kueue["spec"]


def test_measure_tells_when_the_newcomer_held_its_share_and_what_preemption_cost() -> None:
    """4 GPUs, two equal tenants; team-a runs 4 pods from 0 s, team-b joins at 10 s.
    team-a loses two pods (at 14 s and 20 s, after 14 and 20 s of work), team-b one (at
    20 s after 5 s, as its next starts: never 2 GPUs at once); with a third pod from 30 s
    team-b holds its 2 GPUs 20 s after the join. Preemptions after the settling time
    (16 s) count per hour of what is left of the run (16 s to 40 s)."""
    scenario = peer_kueue.Scenario(
        "hand", (whole_gpu_node("gpu-0", 4),),
        (Tenant("team-a", 1, 2), Tenant("team-b", 1, 2)),
        (peer_kueue.Stream("team-a", 0, 4, 1, 1000, preemptible=True),
         peer_kueue.Stream("team-b", 10, 3, 1, 1000, preemptible=True)),
        horizon=40, reclaim=peer_kueue.RECLAIM, settle=16)
    record = peer_kueue.PodRecord
    records = [
        record("team-a", 1, 1000, False, created=0, running=0),
        record("team-a", 1, 1000, False, created=0, running=0),
        record("team-a", 1, 1000, False, created=0, running=0, ended=14,
               disrupted_by="EvictionByEvictionAPI"),
        record("team-a", 1, 1000, False, created=0, running=0, ended=20),
        record("team-b", 1, 1000, False, created=10, running=15, ended=20,
               disrupted_by="PreemptionByScheduler"),
        record("team-b", 1, 1000, False, created=10, running=20),
    ]
    result = peer_kueue.measure(scenario, records, began=0, end=40)
    assert result["entitled_after_s_by_tenant"] == {"team-a": 0.0, "team-b": None}
    assert result["entitled_after_s"] is None
    records.append(record("team-b", 1, 1000, False, created=10, running=30))
    result = peer_kueue.measure(scenario, records, began=0, end=40)
    assert result["entitled_after_s_by_tenant"] == {"team-a": 0.0, "team-b": 20.0}
    assert result["entitled_after_s"] == 20.0
    assert result["preempted"] == 3
    assert result["preempted_gpu_s"] == 14 + 20 + 5
    assert result["preempted_by"] == {"EvictionByEvictionAPI": 1, "PreemptionByScheduler": 1,
                                      "no condition": 1}
    assert result["preempted_after_settle"] == 2
    assert result["preempted_per_hour_after_settle"] == round(2 * 3600 / 24, 1)


def test_a_pod_preempted_before_its_time_is_not_finished_nor_counted_as_finished() -> None:
    """The pod log finishes a pod `duration` after it went Running; one that ended
    before then (evicted at 31 s of 90) is dropped when its time comes, so measure()
    counts it as preempted, while one still running is finished."""
    log = peer_kueue.PodLog(None, None, {})  # type: ignore[arg-type]
    record = peer_kueue.PodRecord
    early = record("team-a", 1, 90, False, created=0, running=0, ended=31)
    running = record("team-a", 1, 90, False, created=0, running=1)
    log.expect("ns", "early", early)
    log.expect("ns", "running", running)
    with log.lock:
        log._due += [(90.0, "ns", "early"), (91.0, "ns", "running")]
        assert log.take_due(100.0) == [("ns", "running")]
    assert (early.finish_asked, running.finish_asked) == (False, True)
    log.stop()


def test_held_from_counts_pods_running_at_once() -> None:
    """A pod that ends as another starts (the same instant) is not counted twice."""
    record = peer_kueue.PodRecord
    records = [record("t", 2, None, False, running=0, ended=5),
               record("t", 2, None, False, running=5, ended=9),
               record("t", 1, None, False, running=7),
               record("u", 4, None, False, running=1)]
    assert peer_kueue.held_from(records, "t", 3, 0) == 7
    assert peer_kueue.held_from(records, "t", 2, 3) == 3
    assert peer_kueue.held_from(records, "t", 4, 0) is None
    assert peer_kueue.held_from(records, "u", 4, 0) == 1


def test_jain_and_percentile() -> None:
    assert peer_kueue.jain([1.0, 1.0, 1.0]) == 1.0
    assert peer_kueue.jain([1.0, 0.0]) == 0.5
    assert peer_kueue.jain([0.0, 0.0]) == 0.0
    samples = [float(v) for v in range(1, 101)]
    assert peer_kueue.percentile(samples, 0.5) == 50.0
    assert peer_kueue.percentile(samples, 0.99) == 99.0
    assert peer_kueue.percentile([7.0], 0.99) == 7.0

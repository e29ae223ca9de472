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
        if len({s.tenant for s in backlogs}) < 2:
            continue
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


def test_jain_and_percentile() -> None:
    assert peer_kueue.jain([1.0, 1.0, 1.0]) == 1.0
    assert peer_kueue.jain([1.0, 0.0]) == 0.5
    assert peer_kueue.jain([0.0, 0.0]) == 0.0
    samples = [float(v) for v in range(1, 101)]
    assert peer_kueue.percentile(samples, 0.5) == 50.0
    assert peer_kueue.percentile(samples, 0.99) == 99.0
    assert peer_kueue.percentile([7.0], 0.99) == 7.0

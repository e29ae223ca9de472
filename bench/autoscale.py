"""Autoscaled pools on the e2e control plane: how long a head that is owed nodes waits
beyond the autoscaler's own delay, and what requests are left behind.

    python bench/autoscale.py                      # delays 2 s and 5 s, 5 pods each
    python bench/autoscale.py --delays 3 --pods 10 --json out.json

A private control plane (tests/e2e/harness) with one 2-GPU node, fairgate installed from
manifests/ with `autoscaling: {mode: provisioningRequest, maxCapacity: {gpu: 64},
inFlight: 4}`, cluster-autoscaler's ProvisioningRequest CRD, and the harness's fake
autoscaler (harness.provisioner), which adds a node `delay` seconds after it first sees
a request. A pod `base` (team-a, 2 GPUs) fills the node.

Turn to Running: for each delay, `--pods` 2-GPU pods of team-a are created one at a time
(the next once the last runs), each the owed head at once (nothing else queued); the
wait is creation to Running. Reported: p50 and max of the wait, and of the wait less
the delay (fairgate, the scheduler and the fake kubelet), and the ratio wait / delay.

Requests for nothing: `--pods` more pods are created with the autoscaler's delay at
`--cancel-delay` (10 s), and each is deleted 1 s after its request appears, before its
nodes come. Reported: requests made, requests whose pods were gone before they were
Provisioned (made for nothing: the autoscaler may have started on them), and requests
(and PodTemplates) still there 30 s after the last pod went (leftovers: the garbage
collector deletes them with their pods; fairgate has no delete grant).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from harness.api import CRDS, serve_crd
from harness.fairgate import PLATFORM_YAML, pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.provisioner import FakeAutoscaler, fake_autoscaler, requests_in
from harness.waiting import wait_for

AUTOSCALING = "autoscaling:\n  mode: provisioningRequest\n  maxCapacity: {gpu: 64}\n  inFlight: 4\n"
QUOTAS = {"team-a": "nominal: {gpu: 64}\nborrowLimit: {gpuEquivalents: 0}\n"
          "inferenceReserve: {gpuEquivalents: 0}\ndefaultClass: training\n"}
PLATFORM = PLATFORM_YAML.replace("ceiling: {gpuEquivalents: 9}", "ceiling: {gpuEquivalents: 64}")
NS = tenant_namespace("team-a")
GPU = {"nvidia.com/gpu": 2}


def _turn_to_running(env: PrivateCluster, autoscaler: FakeAutoscaler, delay: float,
                     pods: int) -> dict[str, Any]:
    autoscaler.delay = delay
    core = pods_api(env.cp, "team-a")
    waits = []
    for i in range(pods):
        name = f"d{delay:g}-{i}".replace(".", "-")
        start = time.monotonic()
        core.create_namespaced_pod(NS, pod_manifest(name, GPU))
        wait_for(partial(running_node, env.admin, NS, name), 120 + delay, f"{name} to run")
        waits.append(time.monotonic() - start)
    return {"delay": delay, "pods": pods,
            "wait_p50": statistics.median(waits), "wait_max": max(waits),
            "over_delay_p50": statistics.median(waits) - delay,
            "over_delay_max": max(waits) - delay,
            "ratio_p50": statistics.median(waits) / delay}


def _for_nothing(env: PrivateCluster, autoscaler: FakeAutoscaler, delay: float,
                 pods: int) -> dict[str, Any]:
    autoscaler.delay = delay
    core = pods_api(env.cp, "team-a")
    before = set(autoscaler.seen)
    gone_at: dict[str, float] = {}
    for i in range(pods):
        name = f"cancel-{i}"
        created = core.create_namespaced_pod(NS, pod_manifest(name, GPU))
        uid = created.metadata.uid
        wait_for(lambda u=uid: next((r["metadata"]["name"] for r in requests_in(env.cp.admin, NS)
                                     if any(o["uid"] == u for o in
                                            r["metadata"]["ownerReferences"])), None),
                 60, f"the request of {name}")
        time.sleep(1.0)
        env.admin.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        gone_at[uid] = time.monotonic()
    time.sleep(30.0)
    made = [s for k, s in autoscaler.seen.items() if k not in before]
    for_nothing = [s for s in made if s.outcome != "Provisioned" or s.done_at > max(
        gone_at.values())]
    leftover = [r["metadata"]["name"] for r in requests_in(env.cp.admin, NS)
                if any(o["uid"] in gone_at for o in r["metadata"]["ownerReferences"])]
    templates = [t for t in env.admin.list_namespaced_pod_template(
        NS, label_selector="fairgate.io/provisioning-for").items
        if any(o.uid in gone_at for o in t.metadata.owner_references or [])]
    return {"delay": delay, "pods": pods, "requests": len(made),
            "for_nothing": len(for_nothing),
            "provisioned_anyway": sum(s.outcome == "Provisioned" for s in made),
            "leftover_requests": len(leftover), "leftover_templates": len(templates)}


def _measure(env: PrivateCluster, autoscaler: FakeAutoscaler,
             args: argparse.Namespace) -> dict[str, Any]:
    pods_api(env.cp, "team-a").create_namespaced_pod(NS, pod_manifest("base", GPU))
    wait_for(partial(running_node, env.admin, NS, "base"), 60, "base to run")
    return {"turn_to_running": [_turn_to_running(env, autoscaler, d, args.pods)
                                for d in args.delays],
            "for_nothing": _for_nothing(env, autoscaler, args.cancel_delay, args.pods)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[2.0, 5.0])
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--cancel-delay", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fairgate-bench-autoscale-") as work, \
            private_cluster(Path(work), (whole_gpu_node("gpu-base-0", gpus=2),),
                            platform_yaml=PLATFORM + AUTOSCALING, quotas=QUOTAS) as env:
        serve_crd(env.cp.admin, CRDS / "autoscaling.x-k8s.io_provisioningrequests.yaml")
        with fake_autoscaler(env.cp, env.kubelet) as autoscaler:
            result = _measure(env, autoscaler, args)
    for row in result["turn_to_running"]:
        print(f"delay {row['delay']:g} s: turn to Running p50 {row['wait_p50']:.2f} s, max "
              f"{row['wait_max']:.2f} s; over the delay p50 {row['over_delay_p50']:.2f} s, "
              f"max {row['over_delay_max']:.2f} s; ratio p50 {row['ratio_p50']:.2f}")
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

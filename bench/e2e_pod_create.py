"""Pod-create latency through a real kube-apiserver, with and without fairgate's webhooks.

Usage: python bench/e2e_pod_create.py [--pods N] [--batch B]

Starts the e2e control plane (tests/e2e/controlplane/build.sh builds it if needed), fake
GPU nodes, fairgate installed from manifests/ with `fairgate serve` and `fairgate
dispatch` running. Then, as a tenant user, it creates 1-GPU pods one at a time in
alternating batches: webhook configurations removed ("without") and applied ("with"),
so that drift on a shared machine hits both sides alike. Each batch's pods are deleted
before the next batch. Prints p50/p99/mean per side as a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from harness.controlplane import ControlPlane, build_controlplane
from harness.fairgate import (
    FairgateStack,
    tenant_namespace,
    tenant_user,
)
from harness.kubelet import FakeKubelet
from harness.manifests import WEBHOOK_KINDS
from harness.pods import pod_manifest
from harness.waiting import wait_for
from kubernetes import client

TENANT = "team-a"
SETTLE_SECONDS = 2.0


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def webhook_active(core: Any, namespace: str) -> bool:
    """Whether the API server currently calls fairgate for a GPU pod (dry-run probe)."""
    pod = core.create_namespaced_pod(
        namespace, pod_manifest("probe", {"nvidia.com/gpu": 1}), dry_run="All"
    )
    return "fairgate.io/tenant" in (pod.metadata.labels or {})


def set_webhooks(stack: FairgateStack, core: Any, namespace: str, on: bool) -> None:
    """Install (mutating, then validating) or remove (validating, then mutating) fairgate.

    The API server watches the two kinds with separate informers. A validating webhook
    active without the mutating one refuses every unstamped GPU pod, and no request shows
    when the validating informer has caught up, so the script waits SETTLE_SECONDS there.
    """
    mutating, validating = WEBHOOK_KINDS
    if on:
        stack.install_webhooks([mutating])
        wait_for(lambda: webhook_active(core, namespace), 30, "the API server to call fairgate")
        stack.install_webhooks([validating])
        time.sleep(SETTLE_SECONDS)
    else:
        stack.uninstall_webhooks([validating])
        time.sleep(SETTLE_SECONDS)
        stack.uninstall_webhooks([mutating])
        wait_for(
            lambda: not webhook_active(core, namespace),
            30,
            "the API server to stop calling fairgate",
        )


def run_batch(
    core: Any, admin: Any, namespace: str, label: str, count: int, start: int
) -> list[float]:
    latencies = []
    for i in range(count):
        body = pod_manifest(f"{label}-{start + i}", {"nvidia.com/gpu": 1})
        began = time.perf_counter()
        core.create_namespaced_pod(namespace, body)
        latencies.append((time.perf_counter() - began) * 1000)
    admin.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not admin.list_namespaced_pod(namespace).items, 60, "batch cleanup")
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="pods per side (default 200)")
    parser.add_argument("--batch", type=int, default=20, help="pods per batch (default 20)")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cp = ControlPlane(build_controlplane(), work / "controlplane")
        cp.start()
        stack.callback(cp.stop)
        kubelet = FakeKubelet(cp)
        kubelet.register_nodes()
        kubelet.start()
        stack.callback(kubelet.stop)
        (work / "fairgate").mkdir()
        fairgate = FairgateStack(cp, work / "fairgate")
        fairgate.install()
        stack.callback(fairgate.stop)
        fairgate.start_webhook()
        fairgate.start_dispatcher()

        user, groups = tenant_user(TENANT)
        core: Any = client.CoreV1Api(cp.client_for(user, groups))
        admin: Any = client.CoreV1Api(cp.admin)
        namespace = tenant_namespace(TENANT)
        samples: dict[str, list[float]] = {"without": [], "with": []}
        done = 0
        while done < args.pods:
            count = min(args.batch, args.pods - done)
            for side in ("without", "with"):
                set_webhooks(fairgate, core, namespace, on=side == "with")
                samples[side] += run_batch(core, admin, namespace, side, count, done)
            done += count
        fairgate.check_alive()

    print(f"{args.pods} pods per side, batches of {args.batch}\n")
    print("| path | p50 ms | p99 ms | mean ms | max ms |")
    print("|---|---|---|---|---|")
    for side, values in samples.items():
        name = "no webhook" if side == "without" else "fairgate mutate + validate"
        print(
            f"| {name} | {percentile(values, 0.5):.1f} | {percentile(values, 0.99):.1f} | "
            f"{statistics.fmean(values):.1f} | {max(values):.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

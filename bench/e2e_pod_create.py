"""Pod-create latency through a real kube-apiserver: no webhook, a trivial allow-all
webhook, and fairgate's webhooks, in one run.

Usage: python bench/e2e_pod_create.py [--pods N] [--batch B]

Starts the e2e control plane (tests/e2e/controlplane/build.sh builds it if needed), fake
GPU nodes, fairgate installed from manifests/ with `fairgate serve` and `fairgate
dispatch` running, and bench/trivial_webhook.py (allow-all, same uvicorn + TLS stack and
certificate, reached through the same Service proxy, with configurations copied from
fairgate's). Then, as a tenant user, it creates 1-GPU pods one at a time in rotating
batches: no webhook configurations ("no webhook"), the trivial ones, and fairgate's, so
that drift on a shared machine hits every side alike. Each batch's pods are deleted
before the next batch. Prints p50/p99/mean per side as a Markdown table; fairgate minus
trivial is fairgate's own cost.
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

import trivial_webhook
from harness.controlplane import ControlPlane, Process, build_controlplane, free_port
from harness.fairgate import (
    SYSTEM_NAMESPACE,
    WEBHOOK_SERVICE,
    FairgateStack,
    tenant_namespace,
    tenant_user,
)
from harness.kubelet import FakeKubelet
from harness.manifests import WEBHOOK_KINDS, apply
from harness.pods import pod_manifest
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

TENANT = "team-a"
SETTLE_SECONDS = 2.0


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


SIDES = {"none": "no webhook", "trivial": "trivial allow-all webhook",
         "fairgate": "fairgate mutate + validate"}


def active(core: Any, namespace: str) -> set[str]:
    """Which webhooks the API server currently calls for a GPU pod (dry-run probe)."""
    pod = core.create_namespaced_pod(
        namespace, pod_manifest("probe", {"nvidia.com/gpu": 1}), dry_run="All"
    )
    called = set()
    if "fairgate.io/tenant" in (pod.metadata.labels or {}):
        called.add("fairgate")
    if trivial_webhook.PROBE_ANNOTATION in (pod.metadata.annotations or {}):
        called.add("trivial")
    return called


class Webhooks:
    """Switches the cluster between the sides: installs (mutating, then validating) or
    removes (validating, then mutating) fairgate's or the trivial configurations.

    The API server watches the two kinds with separate informers. A validating webhook
    active without the mutating one refuses every unstamped GPU pod, and no request shows
    when the validating informer has caught up, so the script waits SETTLE_SECONDS there.
    """

    def __init__(self, cp: ControlPlane, stack: FairgateStack, core: Any,
                 namespace: str) -> None:
        self.cp, self.stack, self.core, self.namespace = cp, stack, core, namespace
        self.trivial = trivial_webhook.trivial_configurations(stack.webhook_configurations)
        self.installed: str | None = "fairgate"  # FairgateStack.install applied them

    def _install(self, side: str, kind: str) -> None:
        if side == "fairgate":
            self.stack.install_webhooks([kind])
        else:
            apply(self.cp.admin, [o for o in self.trivial if o["kind"] == kind])

    def _uninstall(self, side: str, kind: str) -> None:
        if side == "fairgate":
            self.stack.uninstall_webhooks([kind])
            return
        admission: Any = client.AdmissionregistrationV1Api(self.cp.admin)
        delete = (admission.delete_mutating_webhook_configuration if kind == WEBHOOK_KINDS[0]
                  else admission.delete_validating_webhook_configuration)
        try:
            delete(trivial_webhook.NAME)
        except ApiException as error:
            if error.status != 404:
                raise

    def switch(self, side: str) -> None:
        """Make `side` ("none", "trivial" or "fairgate") the one the API server calls."""
        mutating, validating = WEBHOOK_KINDS
        if self.installed is not None and self.installed != side:
            gone = self.installed
            self._uninstall(gone, validating)
            time.sleep(SETTLE_SECONDS)
            self._uninstall(gone, mutating)
            wait_for(lambda: gone not in active(self.core, self.namespace), 30,
                     f"the API server to stop calling {gone}")
            self.installed = None
        if side != "none" and self.installed is None:
            self._install(side, mutating)
            wait_for(lambda: side in active(self.core, self.namespace), 30,
                     f"the API server to call {side}")
            self._install(side, validating)
            time.sleep(SETTLE_SECONDS)
            self.installed = side


def start_cluster(
    stack: contextlib.ExitStack, work: Path, kubelet_interval: float = 0.2
) -> tuple[ControlPlane, FairgateStack]:
    """The e2e control plane with the default fake GPU nodes and a running fake kubelet
    (polling every `kubelet_interval` seconds), fairgate installed with `fairgate serve`
    and `fairgate dispatch` running; all stopped when `stack` closes. `work` holds their
    files."""
    cp = ControlPlane(build_controlplane(), work / "controlplane")
    cp.start()
    stack.callback(cp.stop)
    kubelet = FakeKubelet(cp, interval=kubelet_interval)
    kubelet.register_nodes()
    kubelet.start()
    stack.callback(kubelet.stop)
    (work / "fairgate").mkdir()
    fairgate = FairgateStack(cp, work / "fairgate")
    fairgate.install()
    stack.callback(fairgate.stop)
    fairgate.start_webhook()
    fairgate.start_dispatcher()
    return cp, fairgate


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
        cp, fairgate = start_cluster(stack, Path(tmp))
        port = free_port()
        trivial = Process(
            "trivial-webhook",
            [sys.executable, str(Path(trivial_webhook.__file__)), str(fairgate.cert_dir),
             str(port)],
            cp.log_dir,
        )
        stack.callback(trivial.stop)
        cp.services.route(WEBHOOK_SERVICE, SYSTEM_NAMESPACE, trivial_webhook.PORT, port)

        user, groups = tenant_user(TENANT)
        core: Any = client.CoreV1Api(cp.client_for(user, groups))
        admin: Any = client.CoreV1Api(cp.admin)
        namespace = tenant_namespace(TENANT)
        webhooks = Webhooks(cp, fairgate, core, namespace)
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        done = 0
        while done < args.pods:
            count = min(args.batch, args.pods - done)
            for side in SIDES:
                webhooks.switch(side)
                samples[side] += run_batch(core, admin, namespace, side, count, done)
            done += count
        fairgate.check_alive()
        trivial.check_alive()

    print(f"{args.pods} pods per side, batches of {args.batch}\n")
    print("| path | p50 ms | p99 ms | mean ms | max ms |")
    print("|---|---|---|---|---|")
    for side, values in samples.items():
        name = SIDES[side]
        print(
            f"| {name} | {percentile(values, 0.5):.1f} | {percentile(values, 0.99):.1f} | "
            f"{statistics.fmean(values):.1f} | {max(values):.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

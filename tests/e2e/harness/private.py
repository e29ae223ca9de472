"""A private cluster with fairgate for one test module: its own control plane (the real
scheduler and controllers, node lifecycle included), the fake kubelet serving the nodes
the module asks for, and fairgate installed from manifests/ with the module's platform
config and `fairgate dispatch` flags (its metrics served on a port of its own).

Unlike the session-wide `fairgate` fixture (fixed nodes and namespaces), a
module can shape nodes and flags freely; the cost is one more control plane start.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from .controlplane import CONTROLLERS, ControlPlane, build_controlplane, free_port
from .fairgate import PLATFORM_YAML, QUOTA_YAML, FairgateStack
from .kubelet import FakeKubelet, GpuNode


@dataclass
class PrivateCluster:
    """The parts, and the probes the tests use on them."""

    cp: ControlPlane
    kubelet: FakeKubelet
    fairgate: FairgateStack
    metrics_port: int

    @property
    def admin(self) -> Any:
        """CoreV1Api as the cluster admin."""
        return client.CoreV1Api(self.cp.admin)

    def status(self) -> Any:
        """`fairgate status --json`, parsed."""
        return self.fairgate.status()

    def status_text(self) -> str:
        """`fairgate status` as a user reads it."""
        return self.fairgate.run_cli("status", "--redis-url", self.fairgate.redis_url).stdout

    def why(self, namespace: str, name: str) -> dict[str, Any]:
        """`fairgate why <namespace>/<name> --json`, parsed."""
        result = self.fairgate.run_cli("why", f"{namespace}/{name}", "--json",  # 1: unknown
                                       "--redis-url", self.fairgate.redis_url, check=False)
        report: dict[str, Any] = yaml.safe_load(result.stdout)
        return report

    def class_capacity(self) -> dict[str, int]:
        """Capacity per capacity key, as `fairgate status --json` shows it."""
        return {row["key"]: row["capacity"] for row in self.status()["capacity_by_class"]}

    def metric(self, name: str) -> float:
        """The sum of every sample of metric `name` the dispatcher serves now."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(s.value for family in text_string_to_metric_families(text)
                   for s in family.samples if s.name == name)


@contextmanager
def private_cluster(
    work_dir: Path, nodes: Sequence[GpuNode], *dispatch_args: str,
    platform_yaml: str = PLATFORM_YAML, quotas: Mapping[str, str] = QUOTA_YAML,
    controllers: Sequence[str] = CONTROLLERS,
) -> Iterator[PrivateCluster]:
    """Start everything under `work_dir`, yield it, stop everything; fails if the fake
    kubelet reported errors. `quotas`: each tenant's quota.yaml (FairgateStack);
    `controllers`: the kube-controller-manager controllers to run."""
    cp = ControlPlane(build_controlplane(), work_dir / "controlplane", controllers)
    cp.start()
    kubelet = FakeKubelet(cp, nodes)
    (work_dir / "fairgate").mkdir(parents=True, exist_ok=True)
    stack = FairgateStack(cp, work_dir / "fairgate", platform_yaml, quotas)
    port = free_port()
    try:
        kubelet.register_nodes()
        kubelet.start()
        stack.install()
        stack.start_webhook()
        stack.start_dispatcher(*dispatch_args, "--metrics-port", str(port))
        yield PrivateCluster(cp, kubelet, stack, port)
    finally:
        stack.stop()
        kubelet.stop()
        cp.stop()
    assert not kubelet.errors, f"fake kubelet errors: {kubelet.errors}"

"""Kueue (the peer fairgate is compared with) installed into the e2e cluster and running
as a local process.

`KueueStack.install()` applies the CRDs of the Kueue module (`config/components/crd/bases`,
built and copied by `tests/e2e/controlplane/build_kueue.sh`) with the conversion webhooks
of the module's kustomization, the Secret that Kueue's internal certificate management
fills, and the module's own webhook configurations for Pods and Kueue's objects. As in
a cluster, Kueue signs a certificate for `kueue-webhook-service.kueue-system.svc` and
injects its CA into those configurations and CRDs; the harness copies the Secret into
the manager's certDir, as the kubelet's Secret volume would; the API server reaches the `service`
clientConfig through the control plane's service proxy, as it reaches fairgate's. The
pod webhooks only see namespaces labelled `fairgate.io/tenant`, which is also the
manager's `managedJobsNamespaceSelector`.

`start()` runs `kueue --config` against the API server (as a cluster admin: Kueue's RBAC
is not what is compared), with the module's shipped Configuration and the `pod`
integration only, fair sharing
(`fairSharing.preemptionStrategies`), Admission Fair Sharing on, and the visibility
server off (it would need an APIService). `configure(tenants, namespaces)` creates one
ResourceFlavor, one ClusterQueue per tenant in cohort `tenants` (nominal quota, unlimited
borrowing,
`fairSharing.weight`, reclaim within the cohort and preemption of lower priority within
the queue) and a LocalQueue named `default` in each tenant namespace, so a pod needs no
queue label (LocalQueueDefaulting).
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .controlplane import REPO, ControlPlane, ControlPlaneError, Process, free_port, wait_until_ok
from .manifests import WEBHOOK_KINDS, Manifest, apply
from .pods import pod_manifest
from .waiting import wait_for

BUILD_SCRIPT = REPO / "tests" / "e2e" / "controlplane" / "build_kueue.sh"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
GATE = "kueue.x-k8s.io/admission"
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
TENANT_LABEL = "fairgate.io/tenant"
COHORT = "tenants"
QUEUE = "default"
GPU = "nvidia.com/gpu"


def build_kueue(config_only: bool = False) -> Path:
    """Build (or reuse) the Kueue manager; return its cache directory (bin/, config/).

    `config_only`: only download the module and copy its config/ (seconds, no bin/kueue):
    enough for `crds()` and `webhook_configurations()`. Raises ControlPlaneError with the
    script's output when it fails."""
    command = ["bash", str(BUILD_SCRIPT), *(["--config-only"] if config_only else [])]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} failed (exit {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-8000:]}"
        )
    cache = Path(
        os.environ.get("FAIRGATE_CP_CACHE", Path.home() / ".cache" / "fairgate-controlplane")
    )
    return cache / "kueue"


@dataclass(frozen=True)
class Tenant:
    """A tenant as both systems are given it: fair-share weight, nominal GPUs, and GPUs
    of its nominal kept for its inference (`reserve`: fairgate's inferenceReserve with
    `fairShare.lendInferenceReserve: false`; Kueue lends no more than nominal - reserve,
    its `lendingLimit`)."""

    name: str
    weight: int
    nominal: int
    reserve: int = 0


def crds(config: Path) -> list[Manifest]:
    """The module's CRDs (`config`: its config/components), with the conversion webhook
    that its kustomization patches in routed to Kueue's webhook Service."""
    converted = {yaml.safe_load((config / "crd" / p["path"]).read_text())["metadata"]["name"]
                 for p in yaml.safe_load((config / "crd" / "kustomization.yaml").read_text())
                 ["patches"]}
    result = [yaml.safe_load(p.read_text())
              for p in sorted((config / "crd" / "bases").glob("*.yaml"))]
    for crd in result:
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"service": {"name": SERVICE, "namespace": NAMESPACE,
                                                 "path": "/convert"}},
                    "conversionReviewVersions": ["v1"],
                },
            }
    return result


def webhook_configurations(config: Path) -> list[Manifest]:
    """The module's webhook configurations (`config`: its config/components), only the
    webhooks for Pods and Kueue's own objects (the other integrations are off), named
    `kueue-<name>` and routed to Kueue's webhook Service as kustomize would; the Pod
    webhooks only see namespaces labelled `fairgate.io/tenant`."""
    result = []
    for obj in yaml.safe_load_all((config / "webhook" / "manifests.yaml").read_text()):
        if not obj or obj["kind"] not in WEBHOOK_KINDS:
            continue
        hooks = []
        for hook in obj["webhooks"]:
            resources = [r for rule in hook.get("rules", []) for r in rule["resources"]]
            groups = [g for rule in hook.get("rules", []) for g in rule["apiGroups"]]
            if resources != ["pods"] and GROUP not in groups:
                continue
            hook["clientConfig"]["service"].update(name=SERVICE, namespace=NAMESPACE)
            if resources == ["pods"]:
                hook["namespaceSelector"] = {
                    "matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]
                }
            hooks.append(hook)
        prefix = "kueue-" + obj["metadata"]["name"]
        result.append({**obj, "metadata": {"name": prefix}, "webhooks": hooks})
    return result


class KueueStack:
    """Kueue in the cluster; see the module docstring."""

    def __init__(self, controlplane: ControlPlane, work_dir: Path, home: Path) -> None:
        """`home`: what build_kueue() returned (bin/kueue and the module's config/)."""
        self.cp = controlplane
        self.work_dir = work_dir
        self.home = home
        self.cert_dir = work_dir / "certs"  # Kueue writes its certificates here
        self.port = free_port()
        self.health_port = free_port()
        self.process: Process | None = None
        self.webhooks: list[Manifest] = []

    def install(self) -> None:
        """CRDs (with the conversion webhooks of the module's kustomization), namespace,
        the Secret the certificates go in, and the webhook configurations."""
        config = self.home / "config"
        definitions = crds(config)
        apply(self.cp.admin, definitions)
        extensions: Any = client.ApiextensionsV1Api(self.cp.admin)

        def established() -> bool:
            for crd in definitions:
                status = extensions.read_custom_resource_definition(crd["metadata"]["name"]).status
                if not any(c.type == "Established" and c.status == "True"
                           for c in status.conditions or []):
                    return False
            return True

        wait_for(established, 60, "Kueue's CRDs to be established")
        apply(self.cp.admin, [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": SECRET, "namespace": NAMESPACE}},
        ])
        self.webhooks = webhook_configurations(config)
        for kind in WEBHOOK_KINDS:
            apply(self.cp.admin, [o for o in self.webhooks if o["kind"] == kind])

    def config(self) -> dict[str, Any]:
        """The manager's Configuration: the module's shipped one
        (`config/manager/controller_manager_config.yaml`: client QPS 50 / burst 100,
        reconcile concurrency per kind) with what runs it here and the bench's choices."""
        shipped = self.home / "config" / "manager" / "controller_manager_config.yaml"
        config: dict[str, Any] = yaml.safe_load(shipped.read_text())
        config.update({
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.port, "host": "127.0.0.1", "certDir": str(self.cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET,
            },
            "managedJobsNamespaceSelector": {
                "matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]
            },
            "integrations": {"frameworks": ["pod"]},
            "fairSharing": {
                "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
            },
            "admissionFairSharing": {
                "usageHalfLifeTime": "0s", "usageSamplingInterval": "1s",
                "resourceWeights": {GPU: 1},
            },
            "featureGates": {"VisibilityOnDemand": False},
        })
        return config

    def start(self, timeout: float = 120.0) -> None:
        """Run the manager; return once its webhook gates a pod in a tenant namespace."""
        path = self.work_dir / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(self.config()))
        self.cp.services.route(SERVICE, NAMESPACE, 443, self.port)
        self.process = Process(
            "kueue",
            [str(self.home / "bin" / "kueue"), f"--config={path}", "--zap-log-level=info"],
            self.cp.log_dir,
            env={**os.environ, "KUBECONFIG": str(self.cp.admin_kubeconfig)},
        )
        wait_for(self._mount_secret, timeout, "Kueue to fill its certificate Secret")
        wait_until_ok(f"http://127.0.0.1:{self.health_port}/readyz", None, [self.process],
                      timeout)

    def _mount_secret(self) -> bool:
        """Play the kubelet's Secret volume: once Kueue has written its serving certificate
        into the Secret, put the Secret's files in the webhook's certDir (key first: Kueue
        waits for tls.crt)."""
        self.check_alive()
        core: Any = client.CoreV1Api(self.cp.admin)
        data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
        if "tls.crt" not in data or "tls.key" not in data:
            return False
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for name in sorted(data, key=lambda n: n == "tls.crt"):
            (self.cert_dir / name).write_bytes(base64.b64decode(data[name]))
        return True

    def configure(self, tenants: list[Tenant], namespaces: Mapping[str, str],
                  timeout: float = 60.0) -> None:
        """ResourceFlavor, a ClusterQueue per tenant in one cohort, a LocalQueue `default`
        in each tenant's namespace (`namespaces`: tenant -> namespace, which must exist);
        returns once a dry-run pod in each namespace is gated by Kueue."""
        objects: list[Manifest] = [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": "default"}, "spec": {},
        }]
        for tenant in tenants:
            objects.append({
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue",
                "metadata": {"name": tenant.name},
                "spec": {
                    "cohortName": COHORT,
                    "namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant.name}},
                    "resourceGroups": [{
                        "coveredResources": [GPU],
                        "flavors": [{"name": "default", "resources": [
                            {"name": GPU, "nominalQuota": tenant.nominal,
                             **({"lendingLimit": tenant.nominal - tenant.reserve}
                                if tenant.reserve else {})},
                        ]}],
                    }],
                    "preemption": {
                        "reclaimWithinCohort": "Any",
                        "withinClusterQueue": "LowerPriority",
                        "borrowWithinCohort": {"policy": "Never"},
                    },
                    "fairSharing": {"weight": str(tenant.weight)},
                    "admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"},
                },
            })
            objects.append({
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": namespaces[tenant.name]},
                "spec": {"clusterQueue": tenant.name},
            })
        apply(self.cp.admin, objects)
        core: Any = client.CoreV1Api(self.cp.admin)
        for tenant in tenants:
            namespace = namespaces[tenant.name]

            def gated(ns: str = namespace) -> bool:
                self.check_alive()
                try:
                    pod = core.create_namespaced_pod(
                        ns, pod_manifest("kueue-probe", {GPU: 1}), dry_run="All")
                except ApiException as error:
                    if error.status >= 500:  # webhook not reachable yet
                        return False
                    raise
                return GATE in [g.name for g in pod.spec.scheduling_gates or []]

            wait_for(gated, timeout, f"Kueue's webhook to gate a pod in {namespace}")
        custom: Any = client.CustomObjectsApi(self.cp.admin)

        def active() -> bool:
            for tenant in tenants:
                queue = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues",
                                                         tenant.name)
                conditions = queue.get("status", {}).get("conditions", [])
                if not any(c["type"] == "Active" and c["status"] == "True" for c in conditions):
                    return False
            return True

        wait_for(active, timeout, "every ClusterQueue to be Active")

    def uninstall_webhooks(self) -> None:
        """Delete Kueue's webhook configurations (validating first)."""
        admission: Any = client.AdmissionregistrationV1Api(self.cp.admin)
        for obj in sorted(self.webhooks, key=lambda o: o["kind"], reverse=True):
            delete = (admission.delete_validating_webhook_configuration
                      if obj["kind"] == WEBHOOK_KINDS[1]
                      else admission.delete_mutating_webhook_configuration)
            try:
                delete(obj["metadata"]["name"])
            except ApiException as error:
                if error.status != 404:
                    raise

    def check_alive(self) -> None:
        if self.process is not None:
            self.process.check_alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

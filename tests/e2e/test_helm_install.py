"""fairgate installed with `helm install` of charts/fairgate on a control plane of its own,
then upgraded and uninstalled as docs/install.md says, with `fairgate serve` and
`fairgate dispatch` run by the harness as for the kustomize install.

After the install, GPU pods of a tenant are stamped, admitted and gated exactly as with
the kustomize base; an upgrade goes through fairgate's own ConfigMap validation and keeps
the caBundle that `fairgate serve` injected; the uninstall removes every object of the
release, webhook configurations first. The console's TLS sidecar command makes its
certificate Secret with the console's own RBAC.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from harness.controlplane import REPO, ControlPlane
from harness.fairgate import (
    SYSTEM_NAMESPACE,
    FairgateStack,
    fairgate_command,
    pods_api,
    tenant_namespace,
)
from harness.helm import CHART, helm_run
from harness.kubelet import FakeKubelet
from harness.manifests import WEBHOOK_KINDS
from harness.pods import is_gated, pod_manifest, running_node
from harness.waiting import wait_for
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from certs.redis_secret import acl_file

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(kubectl: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A fresh control plane (the session's holds what other modules applied without
    Helm, which `helm install` would rightly refuse to take over)."""
    cp = ControlPlane(kubectl.parent, tmp_path_factory.mktemp("helm-controlplane"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def nodes(cluster: ControlPlane) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(cluster)
    fake.register_nodes()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def stack(
    cluster: ControlPlane, nodes: FakeKubelet, helm: Path, helm_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FairgateStack]:
    fairgate = FairgateStack(cluster, tmp_path_factory.mktemp("fairgate-helm"))
    try:
        fairgate.install_with_helm(helm, helm_home)
        fairgate.start_webhook()
        fairgate.start_dispatcher()
        yield fairgate
    finally:
        fairgate.stop()


def _helm(helm: Path, home: Path, cluster: ControlPlane, *args: str) -> str:
    result = helm_run(helm, list(args), home, cluster.admin_kubeconfig)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _release_objects(helm: Path, home: Path, cluster: ControlPlane) -> list[dict[str, Any]]:
    manifest = _helm(helm, home, cluster, "get", "manifest", "fairgate", "-n", SYSTEM_NAMESPACE)
    return [d for d in yaml.safe_load_all(manifest) if d]


def _exists(cluster: ControlPlane, obj: dict[str, Any]) -> bool:
    dyn = dynamic.DynamicClient(cluster.admin)  # type: ignore[no-untyped-call]
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _ca_bundles(cluster: ControlPlane) -> list[str | None]:
    admission: Any = client.AdmissionregistrationV1Api(cluster.admin)
    configs = [admission.read_mutating_webhook_configuration("fairgate"),
               admission.read_validating_webhook_configuration("fairgate")]
    return [hook.client_config.ca_bundle for c in configs for hook in c.webhooks]


def _delete_pods(cluster: ControlPlane, namespace: str) -> None:
    core: Any = client.CoreV1Api(cluster.admin)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, "pods to be gone")


def test_install_deploys_every_object_of_the_chart(
    stack: FairgateStack, helm: Path, helm_home: Path, cluster: ControlPlane
) -> None:
    status = _helm(helm, helm_home, cluster, "status", "fairgate", "-n", SYSTEM_NAMESPACE)
    assert "STATUS: deployed" in status
    assert "REVISION: 1" in status
    objects = _release_objects(helm, helm_home, cluster)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", *WEBHOOK_KINDS, "ValidatingAdmissionPolicy",
            "PriorityClass", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert [o for o in objects if not _exists(cluster, o)] == []
    # the Deployments' controllers made their pods (fairgate's own processes are the
    # harness's: the pods are not scheduled on the fake GPU nodes, which taint them away)
    apps: Any = client.AppsV1Api(cluster.admin)
    for name in ("fairgate-webhook", "fairgate-dispatcher", "fairgate-console"):
        wait_for(lambda n=name: apps.read_namespaced_deployment(n, SYSTEM_NAMESPACE)
                 .status.replicas, 60, f"{name}'s pods to be created")
    # `fairgate serve` injected its CA into every webhook of the chart's configurations
    assert all(_ca_bundles(cluster))


def test_a_tenants_gpu_pods_are_admitted_and_gated_as_with_kustomize(
    stack: FairgateStack, cluster: ControlPlane
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(cluster, "team-b")
    try:
        first = core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 4}))
        assert first.metadata.labels["fairgate.io/tenant"] == "team-b"
        assert first.spec.priority_class_name == "fairgate-training"
        assert not first.spec.scheduling_gates
        wait_for(partial(running_node, core, ns, "first"), 30, "first to run")
        second = core.create_namespaced_pod(ns, pod_manifest("second", {"nvidia.com/gpu": 1}))
        assert [g.name for g in second.spec.scheduling_gates] == ["fairgate.io/queue"]
        wait_for(lambda: is_gated(core.read_namespaced_pod("second", ns)), 30,
                 "second to be reported gated")
        core.delete_namespaced_pod("first", ns, grace_period_seconds=0)
        wait_for(partial(running_node, core, ns, "second"), 60,
                 "the dispatcher to release second")
    finally:
        _delete_pods(cluster, ns)


def test_upgrade_changes_a_tenant_through_fairgates_validation(
    stack: FairgateStack, helm: Path, helm_home: Path, cluster: ControlPlane
) -> None:
    _helm(helm, helm_home, cluster, "upgrade", "fairgate", str(CHART), "-n", SYSTEM_NAMESPACE,
          "--reuse-values", "--set", "platform.tenants.team-b.weight=3")
    core: Any = client.CoreV1Api(cluster.admin)
    platform = core.read_namespaced_config_map("fairgate-platform", SYSTEM_NAMESPACE)
    assert yaml.safe_load(platform.data["platform.yaml"])["tenants"]["team-b"]["weight"] == 3
    assert "REVISION: 2" in _helm(helm, helm_home, cluster, "status", "fairgate",
                                  "-n", SYSTEM_NAMESPACE)
    # the upgrade left the injected caBundle alone: admission keeps working
    assert all(_ca_bundles(cluster))
    probe = stack.dry_run_probe()
    assert probe.metadata.labels["fairgate.io/tenant"] == "team-a"
    # fairgate's ConfigMap webhook is in the path of an upgrade: a value it refuses
    # fails the upgrade and the configuration stays as it was
    result = helm_run(helm, ["upgrade", "fairgate", str(CHART), "-n", SYSTEM_NAMESPACE,
                             "--reuse-values", "--set", "quotas.team-b.nominal.gpu=999"],
                      helm_home, cluster.admin_kubeconfig)
    assert result.returncode != 0
    assert "configmaps.validate.fairgate.io" in result.stderr, result.stderr
    quota = core.read_namespaced_config_map("quota-team-b", SYSTEM_NAMESPACE)
    assert yaml.safe_load(quota.data["quota.yaml"])["nominal"]["gpu"] == 4
    _helm(helm, helm_home, cluster, "rollback", "fairgate", "2", "-n", SYSTEM_NAMESPACE)


def test_a_generated_redis_password_survives_upgrades(
    stack: FairgateStack, helm: Path, helm_home: Path, cluster: ControlPlane
) -> None:
    """`redis.generatePassword`: the chart makes the Secret once; a later upgrade reads the
    password back from the cluster instead of making a new one."""
    core: Any = client.CoreV1Api(cluster.admin)

    def password() -> bytes:
        secret = core.read_namespaced_secret("fairgate-redis-auth", SYSTEM_NAMESPACE)
        assert base64.b64decode(secret.data["users.acl"]).decode() == acl_file(
            base64.b64decode(secret.data["password"]).decode())
        return base64.b64decode(secret.data["password"])

    upgrade = ["upgrade", "fairgate", str(CHART), "-n", SYSTEM_NAMESPACE, "--reuse-values"]
    _helm(helm, helm_home, cluster, *upgrade, "--set", "redis.generatePassword=true")
    first = password()
    assert len(first) == 43
    _helm(helm, helm_home, cluster, *upgrade, "--set", "dispatcher.replicas=1")
    assert password() == first


def test_the_console_makes_its_own_certificate_and_serves_it(
    stack: FairgateStack, cluster: ControlPlane, tmp_path: Path
) -> None:
    """The console's TLS sidecar command, as the console's ServiceAccount with the RBAC
    the chart gave it: it creates fairgate-console-tls, writes it out, adopts it the
    next time, and the console serves it; other Secrets stay out of its reach."""
    kubeconfig = cluster.token_kubeconfig(SYSTEM_NAMESPACE, "fairgate-console")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": SYSTEM_NAMESPACE,
           "PYTHONPATH": str(REPO)}
    cert_dir = tmp_path / "console-tls"
    ensure = fairgate_command("certs", "ensure", "--secret", "fairgate-console-tls",
                              "--service", "fairgate-console", "--cert-dir", str(cert_dir))
    first = subprocess.run(ensure, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    issued = (cert_dir / "tls.crt").read_bytes()
    core: Any = client.CoreV1Api(cluster.admin)
    secret = core.read_namespaced_secret("fairgate-console-tls", SYSTEM_NAMESPACE)
    assert secret.type == "kubernetes.io/tls"
    assert secret.metadata.labels["app.kubernetes.io/component"] == "console-tls"
    assert base64.b64decode(secret.data["tls.crt"]) == issued
    names = x509.load_pem_x509_certificate(issued).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "fairgate-console.fairgate-system.svc" in names
    again = subprocess.run(ensure, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (cert_dir / "tls.crt").read_bytes() == issued  # adopted, not replaced
    as_console: Any = client.CoreV1Api(cluster.client_for(
        "system:serviceaccount:fairgate-system:fairgate-console",
        ["system:serviceaccounts", "system:serviceaccounts:fairgate-system"]))
    with pytest.raises(ApiException) as refused:
        as_console.read_namespaced_secret("fairgate-webhook-tls", SYSTEM_NAMESPACE)
    assert refused.value.status == 403
    console = subprocess.Popen(
        fairgate_command("console", "--redis-url", stack.redis_url, "--auth", "kubernetes",
                         "--host", "127.0.0.1", "--port", "0", "--cert-dir", str(cert_dir)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert console.stdout is not None
        line = console.stdout.readline().strip()
        assert line.startswith("console: https://127.0.0.1:"), line
        # the chain is checked against the Secret's CA; the name is the Service's, not
        # 127.0.0.1 (a client in the cluster checks it)
        trust = ssl.create_default_context(cadata=base64.b64decode(secret.data["ca.crt"]).decode())
        trust.check_hostname = False
        url = line.removeprefix("console: ").rstrip("/")
        answer = httpx.get(f"{url}/healthz", verify=trust, timeout=30)
        assert answer.status_code == 200
    finally:
        console.terminate()
        console.wait(10)


def test_uninstall_validating_webhook_first_removes_the_release(
    stack: FairgateStack, helm: Path, helm_home: Path, cluster: ControlPlane
) -> None:
    objects = _release_objects(helm, helm_home, cluster)
    # docs/install.md: the validating configuration first, then the mutating one
    stack.uninstall_webhooks()
    stack.stop()
    _helm(helm, helm_home, cluster, "uninstall", "fairgate", "-n", SYSTEM_NAMESPACE,
          "--wait", "--timeout", "120s")
    assert [o for o in objects if _exists(cluster, o)] == []
    # without fairgate a GPU pod is created as it is: no stamps, no gate
    ns = tenant_namespace("team-a")
    core = pods_api(cluster, "team-a")
    pod = core.create_namespaced_pod(ns, pod_manifest("after", {"nvidia.com/gpu": 1}))
    assert "fairgate.io/tenant" not in (pod.metadata.labels or {})
    assert not pod.spec.scheduling_gates
    _delete_pods(cluster, ns)

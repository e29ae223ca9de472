"""fairgate installed into the e2e cluster and running as real processes.

`FairgateStack.install()` does what an operator would with the kustomize base: it
generates the webhook certificate with `fairgate certs generate` (SANs name the Service
`fairgate-webhook.fairgate-system.svc`), stores it as the `fairgate-webhook-tls` Secret
that `fairgate serve` adopts, applies `manifests/` unchanged except for the e2e tenants'
config and that CA as each webhook's `caBundle`, applies the tenant admin base for every
tenant, and creates one namespace per tenant. `fairgate serve` and `fairgate dispatch`
then run as child processes, authenticated with bound tokens of their own
ServiceAccounts, so fairgate's RBAC is what the API server enforces. The API server
reaches the webhook Service through the control plane's service proxy (harness.proxy),
verifying the certificate against the Service name, as in a real cluster.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .api import wait_for_default_account
from .controlplane import REPO, ControlPlane, Process, free_port, wait_until_ok
from .manifests import WEBHOOK_KINDS, Manifest, apply, load_kustomization, with_ca_bundle
from .pods import pod_manifest
from .waiting import wait_for

SYSTEM_NAMESPACE = "fairgate-system"
WEBHOOK_SERVICE = "fairgate-webhook"
GATE = "fairgate.io/queue"
POLICY = "fairgate-stamps"  # ValidatingAdmissionPolicy and binding in manifests/

# The e2e tenants. Capacity of the default fake nodes: 8 GPUs, 7 x 1g.5gb, 2 x 3g.40gb.
PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team], users: []}
capacity: {}
tenants:
  team-a:
    weight: 2
    ceiling: {gpuEquivalents: 9}   # nominal 5 + borrowLimit 4
    admins: {groups: [team-a-admins], users: [alice@example.com]}
  team-b:
    weight: 1
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-b-admins], users: []}
onRedisUnavailable: deny
"""
# Two tenants of weight 1, each up to 8 GPUs: the private clusters of two whole-GPU nodes.
EVEN_PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team], users: []}
capacity: {}
tenants:
  team-a:
    weight: 1
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-a-admins], users: []}
  team-b:
    weight: 1
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-b-admins], users: []}
onRedisUnavailable: deny
"""
QUOTA_YAML = {
    "team-a": """\
nominal: {gpu: 4, mig-1g.5gb: 7}
borrowLimit: {gpuEquivalents: 4}
inferenceReserve: {gpuEquivalents: 0}
defaultClass: training
""",
    "team-b": """\
nominal: {gpu: 4, mig-3g.40gb: 2}
borrowLimit: {gpuEquivalents: 0}
inferenceReserve: {gpuEquivalents: 0}
defaultClass: training
""",
}


def tenant_namespace(tenant: str) -> str:
    """The namespace the stack creates for `tenant`."""
    return f"{tenant}-dev"


def tenant_user(tenant: str) -> tuple[str, list[str]]:
    """A plain (non-admin) user of `tenant`: name and groups; may manage pods, ResourceClaims
    and ResourceClaimTemplates in its namespace."""
    return f"dev@{tenant}.example.com", [f"{tenant}-devs"]


def pods_api(controlplane: ControlPlane, tenant: str) -> Any:
    """CoreV1Api as the tenant's (non-admin) user."""
    user, groups = tenant_user(tenant)
    return client.CoreV1Api(controlplane.client_for(user, groups))


def fairgate_command(*args: str) -> list[str]:
    """argv running the `fairgate` command of this checkout with this interpreter."""
    return [sys.executable, "-m", "webhook.cli", *args]


def _with_e2e_config(
    objects: Sequence[Manifest], platform_yaml: str, quotas: Mapping[str, str]
) -> list[Manifest]:
    """The base's objects with the example tenant config replaced by the e2e tenants'
    (`platform_yaml`, and `quotas`: tenant -> quota.yaml)."""
    result: list[Manifest] = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "ConfigMap" and name.startswith("quota-"):
            continue
        if obj["kind"] == "ConfigMap" and name == "fairgate-platform":
            obj = {**obj, "data": {"platform.yaml": platform_yaml}}
        result.append(obj)
    for tenant, quota in quotas.items():
        result.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"quota-{tenant}",
                    "namespace": SYSTEM_NAMESPACE,
                    "labels": {"fairgate.io/quota": tenant},
                },
                "data": {"quota.yaml": quota},
            }
        )
    return result


def _tenant_admin_objects(tenant: str) -> list[Manifest]:
    """manifests/tenant-admin (written for team-a) instantiated for `tenant`, as documented."""
    text = yaml.safe_dump_all(load_kustomization(REPO / "manifests" / "tenant-admin"))
    return [o for o in yaml.safe_load_all(text.replace("team-a", tenant)) if o]


def create_tenant_namespace(controlplane: ControlPlane, tenant: str) -> None:
    """The tenant's namespace (labelled `fairgate.io/tenant`) and its users' Role (applied:
    a later module's install finds them from an earlier one and takes them over)."""
    namespace = tenant_namespace(tenant)
    _, groups = tenant_user(tenant)
    rbac = "rbac.authorization.k8s.io"
    apply(controlplane.admin, [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"fairgate.io/tenant": tenant}},
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": "gpu-user", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"],
                    "verbs": ["get", "list", "watch", "create", "delete"],
                },
            ],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gpu-user", "namespace": namespace},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "gpu-user"},
            "subjects": [{"apiGroup": rbac, "kind": "Group", "name": groups[0]}],
        },
    ])
    wait_for_default_account(client.CoreV1Api(controlplane.admin), namespace)


class FairgateStack:
    """fairgate in the cluster; see the module docstring."""

    def __init__(
        self, controlplane: ControlPlane, work_dir: Path, platform_yaml: str = PLATFORM_YAML,
        quotas: Mapping[str, str] = QUOTA_YAML,
    ) -> None:
        """`platform_yaml`: the platform config to install (the e2e tenants of QUOTA_YAML,
        e.g. PLATFORM_YAML with a `nodePool` for one of them); `quotas`: each tenant's
        quota.yaml (a platform config naming other tenants brings its own)."""
        self.cp = controlplane
        self.platform_yaml = platform_yaml
        self.quotas = dict(quotas)
        self.work_dir = work_dir
        self.redis = RedisServer(work_dir / "redis", controlplane.log_dir)
        self.redis_url = self.redis.url
        self.cert_dir = work_dir / "certs"
        self.port = free_port()
        self.webhook: Process | None = None
        self.dispatcher: Process | None = None
        self._env: dict[str, dict[str, str]] = {}
        self._webhooks: list[Manifest] = []

    # -- install -----------------------------------------------------------------------

    def install(self) -> None:
        """Redis, certificates, manifests, tenant admin RBAC, tenant namespaces and users."""
        self.redis.start()
        self.run_cli("certs", "generate", "--out", str(self.cert_dir))
        ca_bundle = base64.b64encode((self.cert_dir / "ca.crt").read_bytes()).decode()
        objects = with_ca_bundle(
            _with_e2e_config(load_kustomization(REPO / "manifests"), self.platform_yaml,
                             self.quotas),
            ca_bundle,
        )
        self._webhooks = [o for o in objects if o["kind"] in WEBHOOK_KINDS]
        apply(self.cp.admin, [o for o in objects if o not in self._webhooks])
        self._store_tls_secret()
        self._install_tenants()
        self.install_webhooks()

    def install_with_helm(self, helm: Path, helm_home: Path) -> None:
        """What `install` does, with fairgate's objects from `helm install` of the chart
        charts/fairgate as docs/install.md gives it: the namespace fairgate-system made
        first (with its Pod Security labels), the e2e tenants as values. The webhook
        configurations come without caBundle (as in a cluster): `fairgate serve` patches
        it in when it starts, from the Secret fairgate-webhook-tls stored here."""
        from .helm import CHART, helm_run

        self.redis.start()
        self.run_cli("certs", "generate", "--out", str(self.cert_dir))
        namespace = next(o for o in load_kustomization(REPO / "manifests")
                         if o["kind"] == "Namespace")
        apply(self.cp.admin, [namespace])
        self._store_tls_secret()
        values = self.work_dir / "e2e-values.yaml"
        values.write_text(yaml.safe_dump({
            "platform": yaml.safe_load(self.platform_yaml),
            "quotas": {tenant: yaml.safe_load(quota) for tenant, quota in self.quotas.items()},
        }))
        result = helm_run(helm, [
            "install", "fairgate", str(CHART), "--namespace", SYSTEM_NAMESPACE,
            "--values", str(values),
        ], helm_home, self.cp.admin_kubeconfig)
        if result.returncode != 0:
            raise RuntimeError(f"helm install failed:\n{result.stdout}\n{result.stderr}")
        self._install_tenants()

    def _install_tenants(self) -> None:
        for tenant in self.quotas:
            apply(self.cp.admin, _tenant_admin_objects(tenant))
            create_tenant_namespace(self.cp, tenant)
        for component in ("webhook", "dispatcher"):
            kubeconfig = self.cp.token_kubeconfig(SYSTEM_NAMESPACE, f"fairgate-{component}")
            self._env[component] = {
                **os.environ,
                "KUBECONFIG": str(kubeconfig),
                "POD_NAMESPACE": SYSTEM_NAMESPACE,
                "PYTHONPATH": str(REPO),
            }

    def _store_tls_secret(self) -> None:
        data = {
            name: base64.b64encode((self.cert_dir / name).read_bytes()).decode()
            for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")
        }
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "fairgate-webhook-tls", "namespace": SYSTEM_NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": data,
        }
        apply(self.cp.admin, [secret])

    # -- processes ---------------------------------------------------------------------

    def run_cli(
        self, *args: str, component: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one `fairgate` command to completion (as `component`'s identity if given)."""
        env = self._env[component] if component else {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run(
            fairgate_command(*args),
            capture_output=True,
            text=True,
            env=env,
            cwd=self.work_dir,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"fairgate {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def start_webhook(self, timeout: float = 60.0) -> None:
        """Start `fairgate serve`; return once the API server's calls to it succeed."""
        self.cp.services.route(WEBHOOK_SERVICE, SYSTEM_NAMESPACE, 443, self.port)
        self.webhook = Process(
            "fairgate-serve",
            fairgate_command(
                "serve",
                "--cert-dir",
                str(self.cert_dir),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--redis-url",
                self.redis_url,
            ),
            self.cp.log_dir,
            env=self._env["webhook"],
        )
        # The certificate names the Service, not 127.0.0.1: check the chain only here;
        # the API server checks the name too when it calls through the service proxy.
        context = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        context.check_hostname = False
        wait_until_ok(f"https://127.0.0.1:{self.port}/readyz", context, [self.webhook], timeout)
        wait_for(
            lambda: "fairgate.io/tenant" in (self.dry_run_probe().metadata.labels or {}),
            timeout,
            "the API server to call fairgate serve",
        )

    def dry_run_probe(self) -> Any:
        """A 1-GPU pod of the first tenant created with dry run (nothing changes in Redis)."""
        core: Any = client.CoreV1Api(self.cp.admin)
        return core.create_namespaced_pod(
            tenant_namespace(next(iter(self.quotas))),
            pod_manifest("probe", {"nvidia.com/gpu": 1}),
            dry_run="All",
        )

    def stop_webhook(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None

    def start_dispatcher(self, *args: str, timeout: float = 60.0) -> None:
        """Start `fairgate dispatch` (with more `args`, e.g. `--unschedulable-grace 5`);
        return once a fitting pod would be admitted at once.

        Until the dispatcher has published the cluster's capacity, the webhook queues
        every pod; a dry-run probe that comes back without the gate shows it has.
        """
        self.dispatcher = Process(
            "fairgate-dispatch",
            fairgate_command(
                "dispatch",
                "--redis-url",
                self.redis_url,
                *args,
            ),
            self.cp.log_dir,
            env=self._env["dispatcher"],
        )
        self.wait_admitting(timeout)

    def wait_admitting(self, timeout: float = 60.0) -> None:
        """Wait until a fitting pod would be admitted without the gate (dry-run probe)."""
        wait_for(
            self._admits_fitting_pod,
            timeout,
            "fairgate to admit a fitting pod (the dispatcher to publish capacity)",
        )

    def _admits_fitting_pod(self) -> bool:
        self.check_alive()
        try:
            return not self.dry_run_probe().spec.scheduling_gates
        except ApiException as error:
            # fairgate's own "cannot reach its queue" (503) while it is starting, e.g. its
            # first call, which loads the queue's Redis functions, timing out on a loaded
            # machine: not ready yet (anything else is a failure)
            if error.status == 503 and "fairgate" in str(error.body):
                return False
            raise

    def stop_dispatcher(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher = None

    def check_alive(self) -> None:
        """Raise (with the log tail) if `fairgate serve` or `fairgate dispatch` has died."""
        for process in (self.webhook, self.dispatcher):
            if process is not None:
                process.check_alive()

    @property
    def webhook_configurations(self) -> list[Manifest]:
        """fairgate's Mutating- and ValidatingWebhookConfiguration, as installed."""
        return list(self._webhooks)

    def install_webhooks(self, kinds: Sequence[str] = WEBHOOK_KINDS) -> None:
        """(Re)apply the webhook configurations `fairgate` of `kinds`, in that order."""
        for kind in kinds:
            apply(self.cp.admin, [o for o in self._webhooks if o["kind"] == kind])

    def uninstall_webhooks(self, kinds: Sequence[str] = WEBHOOK_KINDS[::-1]) -> None:
        """Delete the webhook configurations `fairgate` of `kinds` (validating first by
        default: alone, it would refuse GPU pods that the mutating one did not stamp)."""
        admission: Any = client.AdmissionregistrationV1Api(self.cp.admin)
        delete = {
            "MutatingWebhookConfiguration": admission.delete_mutating_webhook_configuration,
            "ValidatingWebhookConfiguration": admission.delete_validating_webhook_configuration,
        }
        for kind in kinds:
            try:
                delete[kind]("fairgate")
            except ApiException as error:
                if error.status != 404:  # never installed: install() failed early
                    raise

    def uninstall_policies(self) -> None:
        """Delete fairgate's ValidatingAdmissionPolicy and its binding (as the webhooks:
        tests elsewhere see a cluster without fairgate)."""
        admission: Any = client.AdmissionregistrationV1Api(self.cp.admin)
        for delete in (
            admission.delete_validating_admission_policy_binding,
            admission.delete_validating_admission_policy,
        ):
            try:
                delete(POLICY)
            except ApiException as error:
                if error.status != 404:  # never installed: install() failed early
                    raise

    def stop(self) -> None:
        self.stop_dispatcher()
        self.stop_webhook()
        self.redis.stop()

    def status(self) -> Mapping[str, Any]:
        """`fairgate status --json`, parsed."""
        result = self.run_cli("status", "--json", "--redis-url", self.redis_url)
        parsed: Mapping[str, Any] = yaml.safe_load(result.stdout)
        return parsed

    def tenant_state(self, tenant: str) -> Mapping[str, Any]:
        """`fairgate status --json`'s row for `tenant` ({} while the queue does not know it)."""
        state: Mapping[str, Any] = self.status()["tenants"].get(tenant, {})
        return state

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until fairgate reports no usage and nothing queued for any tenant."""

        def busy() -> dict[str, Any]:
            rows = {t: self.tenant_state(t) for t in self.quotas}
            return {
                t: row
                for t, row in rows.items()
                if row.get("used") or any(row.get("queued", {}).values())
            }

        wait_for(lambda: not busy(), timeout, "fairgate to report no usage and no queue")


class RedisServer:
    """A private redis-server on a fixed loopback port that a test can stop and restart."""

    def __init__(self, work_dir: Path, log_dir: Path) -> None:
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Process | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start it empty (no persistence) and wait until it answers PING."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.process = Process(
            "redis-server",
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.work_dir),
            ],
            self.log_dir,
        )
        wait_for(self._answers, timeout, f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        client_ = redis.Redis.from_url(self.url, socket_timeout=0.5)
        try:
            return bool(client_.ping())
        except redis.ConnectionError:
            return False
        finally:
            client_.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

"""The workloads, their Services, network policy, PriorityClasses and config."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from manifest_objects import Obj, find, of_kind, selects

from tenants.models import QUOTA_LABEL, PriorityClasses
from tenants.schema import parse_platform, parse_quota

REDIS_URL = "redis://fairgate-redis:6379/0"
REDIS_SECRET = "fairgate-redis-auth"
FAIRGATE_WORKLOADS = [("Deployment", "fairgate-webhook"), ("Deployment", "fairgate-dispatcher"),
                      ("Deployment", "fairgate-console")]
ALL_WORKLOADS = [*FAIRGATE_WORKLOADS, ("StatefulSet", "fairgate-redis")]


def _pod_spec(base: list[Obj], kind: str, name: str) -> Obj:
    spec: Obj = find(base, kind, name)["spec"]["template"]["spec"]
    return spec


def _env(container: Obj) -> dict[str, str]:
    """A container's literal environment values (Kubernetes expands $(NAME) from these)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _only_container(pod_spec: Obj) -> Obj:
    assert len(pod_spec["containers"]) == 1
    container: Obj = pod_spec["containers"][0]
    return container


@pytest.mark.parametrize(("kind", "name"), ALL_WORKLOADS)
def test_restricted_security_context(base: list[Obj], kind: str, name: str) -> None:
    """Every pod meets the `restricted` Pod Security Standard, and more (init
    containers included)."""
    spec = _pod_spec(base, kind, name)
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] > 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    _only_container(spec)
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "privileged" not in sc
    assert not spec.get("hostNetwork") and not spec.get("hostPID")


@pytest.mark.parametrize(("kind", "name"), ALL_WORKLOADS)
def test_requests_and_limits(base: list[Obj], kind: str, name: str) -> None:
    resources = _only_container(_pod_spec(base, kind, name))["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_namespace_enforces_restricted(base: list[Obj]) -> None:
    labels = find(base, "Namespace", "fairgate-system")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize(("kind", "name"), FAIRGATE_WORKLOADS)
def test_fairgate_image_runs_as_the_image_user(base: list[Obj], kind: str, name: str) -> None:
    spec = _pod_spec(base, kind, name)
    assert spec["securityContext"]["runAsUser"] == 65532  # USER in the Dockerfile
    assert _only_container(spec)["image"] == "fairgate:0.1.0"
    assert spec["serviceAccountName"] == name


def test_webhook_deployment(base: list[Obj]) -> None:
    deployment = find(base, "Deployment", "fairgate-webhook")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = deployment["spec"]["template"]["spec"]
    container = _only_container(spec)
    assert container["command"] == [
        "fairgate",
        "serve",
        "--cert-dir",
        "/var/run/fairgate/certs",
        "--port",
        "8443",
        "--redis-url",
        "$(REDIS_URL)",
    ]
    assert _env(container)["REDIS_URL"] == REDIS_URL
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for probe in [*probes.values(), container["startupProbe"]["httpGet"]]:
        assert (probe["scheme"], probe["port"]) == ("HTTPS", "https")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    cert_volume = volumes[mounts["/var/run/fairgate/certs"]]
    assert "emptyDir" in cert_volume
    assert "emptyDir" in volumes[mounts["/tmp"]]
    # Pods spread over nodes, selecting exactly the webhook's own pods.
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_webhook_pdb_keeps_one(base: list[Obj]) -> None:
    pdb = find(base, "PodDisruptionBudget", "fairgate-webhook")
    deployment = find(base, "Deployment", "fairgate-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_webhook_service(base: list[Obj]) -> None:
    service = find(base, "Service", "fairgate-webhook")
    deployment = find(base, "Deployment", "fairgate-webhook")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")
    container = _only_container(deployment["spec"]["template"]["spec"])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == 8443


def test_dispatcher_deployment(base: list[Obj]) -> None:
    spec = _pod_spec(base, "Deployment", "fairgate-dispatcher")
    container = _only_container(spec)
    assert container["command"] == ["fairgate", "dispatch", "--redis-url", "$(REDIS_URL)"]
    assert _env(container)["REDIS_URL"] == REDIS_URL
    assert "ports" not in container


TLS_DIR = "/etc/fairgate/console-tls"


def test_console_deployment_and_service(base: list[Obj]) -> None:
    deployment = find(base, "Deployment", "fairgate-console")
    spec = deployment["spec"]["template"]["spec"]
    container = _only_container(spec)
    assert container["command"] == ["fairgate", "console", "--redis-url", "$(REDIS_URL)",
                                    "--auth", "kubernetes", "--host", "0.0.0.0",
                                    "--port", "8443", "--cert-dir", TLS_DIR]
    assert _env(container)["REDIS_URL"] == REDIS_URL
    assert spec["serviceAccountName"] == "fairgate-console"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named == {"https": 8443}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "https",
                                               "scheme": "HTTPS"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    # the serving certificate: written by the TLS sidecar into an in-memory dir, mounted
    # read-only where --cert-dir reads
    assert volumes["tls"] == {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}
    service = find(base, "Service", "fairgate-console")
    (sidecar,) = spec["initContainers"]
    # a native sidecar: started before the console, kept running (renewals)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["command"] == ["fairgate", "certs", "ensure",
                                  "--secret", "fairgate-console-tls",
                                  "--service", service["metadata"]["name"],
                                  "--cert-dir", TLS_DIR, "--every", "3600"]
    assert {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}["tls"] == TLS_DIR
    # the console starts once the certificate (written after its key) is there
    assert sidecar["startupProbe"]["exec"]["command"] == ["test", "-s", f"{TLS_DIR}/tls.crt"]
    assert sidecar["resources"]["limits"] and sidecar["resources"]["requests"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")


def test_console_reachable_only_on_its_port(base: list[Obj]) -> None:
    policy = _policy(base, "fairgate-console")["spec"]
    assert selects(policy["podSelector"], _pod_labels(base, "Deployment", "fairgate-console"))
    assert not selects(policy["podSelector"], _pod_labels(base, "Deployment", "fairgate-webhook"))
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8443}]


def test_redis_statefulset_persists_with_aof(base: list[Obj]) -> None:
    sts = find(base, "StatefulSet", "fairgate-redis")
    service = find(base, "Service", "fairgate-redis")
    assert sts["spec"]["serviceName"] == "fairgate-redis"
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 6379
    container = _only_container(sts["spec"]["template"]["spec"])
    args = container["command"]
    assert args[0] == "redis-server"
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == data_dir
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def _secret_env(container: Obj, name: str) -> Obj:
    """The ``secretKeyRef`` of env var ``name`` (fails when it is missing or a literal)."""
    (entry,) = [e for e in container.get("env", []) if e["name"] == name]
    assert "value" not in entry, f"{name} must come from a Secret, not a literal"
    ref: Obj = entry["valueFrom"]["secretKeyRef"]
    return ref


def _all_containers(base: list[Obj]) -> list[tuple[str, Obj]]:
    return [(f"{kind}/{name}/{c['name']}", c)
            for kind, name in ALL_WORKLOADS
            for c in [*_pod_spec(base, kind, name).get("initContainers", []),
                      *_pod_spec(base, kind, name)["containers"]]]


def test_redis_does_not_start_without_the_password_secret(base: list[Obj]) -> None:
    """Redis loads the ACL file of the Secret (no optional fallback): without it the
    pod does not start, and with it no client gets in without the password."""
    spec = _pod_spec(base, "StatefulSet", "fairgate-redis")
    container = _only_container(spec)
    args = container["command"]
    assert args[args.index("--protected-mode") + 1] == "yes"
    assert "--requirepass" not in args  # it would put the password on the command line
    acl_path = args[args.index("--aclfile") + 1]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount_dir, _, file_name = acl_path.rpartition("/")
    assert mounts[mount_dir]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret = volumes[mounts[mount_dir]["name"]]["secret"]
    assert secret["secretName"] == REDIS_SECRET
    assert not secret.get("optional")
    assert {"key": "users.acl", "path": file_name} in secret["items"]
    assert secret["defaultMode"] & 0o007 == 0  # not world-readable
    # The readiness probe authenticates (redis-cli reads REDISCLI_AUTH) and wants PONG:
    # redis-cli exits 0 on a NOAUTH or LOADING reply.
    ref = _secret_env(container, "REDISCLI_AUTH")
    assert (ref["name"], ref["key"]) == (REDIS_SECRET, "password")
    assert not ref.get("optional")
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "redis-cli" in probe and "PONG" in probe


@pytest.mark.parametrize(("kind", "name"), FAIRGATE_WORKLOADS)
def test_every_redis_client_reads_the_password_from_the_secret(
    base: list[Obj], kind: str, name: str
) -> None:
    container = _only_container(_pod_spec(base, kind, name))
    ref = _secret_env(container, "REDIS_PASSWORD")
    assert (ref["name"], ref["key"]) == (REDIS_SECRET, "password")
    assert not ref.get("optional")
    assert urlsplit(_env(container)["REDIS_URL"]).password is None
    assert "--redis-password-file" not in container["command"]


def test_no_password_is_written_into_the_manifests(base: list[Obj]) -> None:
    """No Secret object with a fixed password ships in the base, and no container has a
    literal value for anything that looks like a credential."""
    assert of_kind(base, "Secret") == []
    for where, container in _all_containers(base):
        for entry in container.get("env", []):
            if any(w in entry["name"] for w in ("PASSWORD", "AUTH", "TOKEN", "SECRET")):
                assert "value" not in entry, f"{where}: {entry['name']} is a literal"
        assert not any("requirepass" in str(arg) for arg in container.get("command", []))


def test_the_webhook_creates_the_redis_secret_before_anything_reads_it(
    base: list[Obj],
) -> None:
    spec = _pod_spec(base, "Deployment", "fairgate-webhook")
    (init,) = spec["initContainers"]
    assert init["command"] == ["fairgate", "redis-secret"]
    assert init["image"] == _only_container(spec)["image"]
    assert set(init["resources"]) == {"requests", "limits"}
    namespace = [e for e in init["env"] if e["name"] == "POD_NAMESPACE"]
    assert namespace[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # Its ServiceAccount may create that Secret (pinned in test_rbac.py).
    assert spec["serviceAccountName"] == "fairgate-webhook"


def _policy(base: list[Obj], name: str) -> Obj:
    return find(base, "NetworkPolicy", name)


def _pod_labels(base: list[Obj], kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = find(base, kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_ingress_denied_by_default(base: list[Obj]) -> None:
    policy = _policy(base, "fairgate-default-deny-ingress")
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


def test_webhook_reachable_only_on_its_port(base: list[Obj]) -> None:
    policy = _policy(base, "fairgate-webhook")["spec"]
    assert selects(policy["podSelector"], _pod_labels(base, "Deployment", "fairgate-webhook"))
    assert not selects(policy["podSelector"], _pod_labels(base, "StatefulSet", "fairgate-redis"))
    (rule,) = policy["ingress"]
    # From anywhere (API server addresses cannot be selected), one port only.
    assert "from" not in rule
    assert rule["ports"] == [{"protocol": "TCP", "port": 8443}]


def test_redis_reachable_only_from_fairgate(base: list[Obj]) -> None:
    policy = _policy(base, "fairgate-redis")["spec"]
    assert selects(policy["podSelector"], _pod_labels(base, "StatefulSet", "fairgate-redis"))
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["egress"] == []
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace only
    for kind, name in FAIRGATE_WORKLOADS:
        assert selects(peer["podSelector"], _pod_labels(base, kind, name))
    stranger = {
        "app.kubernetes.io/name": "something-else",
        "app.kubernetes.io/component": "webhook",
    }
    assert not selects(peer["podSelector"], stranger)
    assert not selects(peer["podSelector"], _pod_labels(base, "StatefulSet", "fairgate-redis"))


def test_priority_classes_match_the_design(base: list[Obj]) -> None:
    defaults = PriorityClasses()
    for band in ("inference", "training", "borrowed"):
        spec = defaults.for_band(band)
        pc = find(base, "PriorityClass", spec.name)
        assert (pc["value"], pc["preemptionPolicy"]) == (spec.value, spec.preemption_policy)
        assert pc["globalDefault"] is False
    values = [
        find(base, "PriorityClass", f"fairgate-{b}")["value"]
        for b in ("inference", "training", "borrowed")
    ]
    assert values == [100000, 10000, 1000]
    assert find(base, "PriorityClass", "fairgate-borrowed")["preemptionPolicy"] == "Never"


def test_example_config_parses_with_fairgates_own_schema(base: list[Obj]) -> None:
    platform_cm = find(base, "ConfigMap", "fairgate-platform")
    assert set(platform_cm["data"]) == {"platform.yaml"}
    platform = parse_platform(platform_cm["data"]["platform.yaml"])
    quotas = [
        cm for cm in of_kind(base, "ConfigMap") if cm["metadata"]["name"].startswith("quota-")
    ]
    assert {cm["metadata"]["name"] for cm in quotas} == {"quota-team-a", "quota-team-b"}
    for cm in quotas:
        tenant = cm["metadata"]["name"].removeprefix("quota-")
        assert cm["metadata"]["labels"][QUOTA_LABEL] == tenant
        assert set(cm["data"]) == {"quota.yaml"}
        assert tenant in platform.tenants
        parse_quota(cm["data"]["quota.yaml"], tenant, platform)  # raises on any problem


def test_design_example_is_verbatim(base: list[Obj]) -> None:
    """quota-team-a is the design's own example, field for field."""
    quota: Any = yaml.safe_load(find(base, "ConfigMap", "quota-team-a")["data"]["quota.yaml"])
    assert quota == {
        "nominal": {"gpu": 8, "mig-1g.5gb": 14},
        "borrowLimit": {"gpuEquivalents": 4},
        "inferenceReserve": {"gpuEquivalents": 2},
        "defaultClass": "training",
    }

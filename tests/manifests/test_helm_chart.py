"""The Helm chart charts/fairgate: `helm lint` passes, every rendering is valid Kubernetes
(the strict schema check of the base), its values are checked by values.schema.json
with messages that name the value, and it renders the same objects as kustomize.

One source of truth: the chart's templates are written after the kustomize base, and
the tests here hold them to it. With default values `helm template` prints exactly the
objects of `manifests/` (compared whole: kind, name, namespace, labels, specs), the
Namespace apart (`namespace.create`); with `redis.mode=sentinel` exactly those of
`overlays/ha/`. The only normalisation: the YAML documents inside ConfigMaps
(platform.yaml, quota.yaml) are compared parsed, since the chart writes them from
values, without the base's comments.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.helm import CHART, helm_run
from manifest_objects import REPO, Obj, find, kustomize_build, of_kind
from test_manifest_schema import SCHEMA_VERSIONS, _validate

from certs.redis_secret import acl_file
from tenants.models import PlatformConfig, QuotaSpec, TenantSpec
from tenants.schema import parse_platform, parse_quota

# Kinds from CRDs that the optional parts of the chart render; the schema check of
# kubernetes-validate knows only the API's own kinds.
CRD_KINDS = {"ServiceMonitor", "Certificate"}


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _run(helm: Path, home: Path, *args: str) -> Any:
    return helm_run(helm, list(args), home, timeout=120)


def render(helm: Path, home: Path, *sets: str, values: Obj | None = None) -> list[Obj]:
    """`helm template` of the chart (release `fairgate` in fairgate-system) with `--set`
    arguments `sets` and a values file holding `values`."""
    args = ["template", "fairgate", str(CHART), "--namespace", "fairgate-system"]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        path = home / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    proc = _run(helm, home, *args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def refused(helm: Path, home: Path, *sets: str, values: Obj | None = None) -> str:
    """The error of a `helm template` that must fail."""
    args = ["template", "fairgate", str(CHART), "--namespace", "fairgate-system"]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        path = home / "bad-values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    proc = _run(helm, home, *args)
    assert proc.returncode != 0, f"helm template accepted {sets or values}"
    stderr: str = proc.stderr
    return stderr


def _key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _normalised(obj: Obj) -> Obj:
    if obj["kind"] == "ConfigMap":
        return {**obj, "data": {k: yaml.safe_load(v) for k, v in obj.get("data", {}).items()}}
    return obj


def _by_key(objs: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    keyed = {_key(o): _normalised(o) for o in objs}
    assert len(keyed) == len(objs), "two objects with the same kind, namespace and name"
    return keyed


def assert_same_objects(chart: list[Obj], kustomize: list[Obj]) -> None:
    ours, theirs = _by_key(chart), _by_key(kustomize)
    assert sorted(ours) == sorted(theirs), (
        f"only in the chart: {sorted(set(ours) - set(theirs))}; "
        f"only in kustomize: {sorted(set(theirs) - set(ours))}"
    )
    for key, obj in theirs.items():
        assert ours[key] == obj, f"{key} differs"


@pytest.fixture(scope="module")
def default(helm: Path, helm_home: Path) -> list[Obj]:
    return render(helm, helm_home)


@pytest.fixture(scope="module")
def ha_chart(helm: Path, helm_home: Path) -> list[Obj]:
    return render(helm, helm_home, "redis.mode=sentinel")


def test_helm_lint_strict(helm: Path, helm_home: Path) -> None:
    proc = _run(helm, helm_home, "lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_helm_lint_sentinel(helm: Path, helm_home: Path) -> None:
    proc = _run(helm, helm_home, "lint", "--strict", str(CHART), "--set", "redis.mode=sentinel")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_values_render_the_kustomize_base(default: list[Obj], base: list[Obj]) -> None:
    assert_same_objects(default, [o for o in base if o["kind"] != "Namespace"])


def test_namespace_create_renders_the_bases_namespace(
    helm: Path, helm_home: Path, base: list[Obj]
) -> None:
    """With namespace.create (a release kept in another namespace) the chart renders
    everything the base does, its Namespace with the Pod Security labels included."""
    args = ["template", "fairgate", str(CHART), "--namespace", "default",
            "--set", "namespace.create=true"]
    proc = _run(helm, helm_home, *args)
    assert proc.returncode == 0, proc.stderr
    assert_same_objects([d for d in yaml.safe_load_all(proc.stdout) if d], base)


def test_namespace_create_in_its_own_namespace_is_refused(helm: Path, helm_home: Path) -> None:
    message = refused(helm, helm_home, "namespace.create=true")
    assert "namespace.create=true needs a release namespace other than fairgate-system" in message


def test_sentinel_mode_renders_the_ha_overlay(ha_chart: list[Obj], kubetool: Path) -> None:
    ha = kustomize_build(kubetool, REPO / "overlays" / "ha")
    assert_same_objects(ha_chart, [o for o in ha if o["kind"] != "Namespace"])


def test_template_output_validates_strictly(helm: Path, helm_home: Path) -> None:
    """The schema check of the base, on the chart with every option turned on or off."""
    renderings = {
        "default": render(helm, helm_home),
        "sentinel": render(helm, helm_home, "redis.mode=sentinel"),
        "everything": render(
            helm, helm_home, "serviceMonitor.enabled=true", "redis.password=s3cret",
            "redis.storageClassName=fast", "console.tls.mode=cert-manager",
            "redis.generatePassword=true",
            "console.tls.certManager.issuerRef.name=ca", "webhook.failurePolicy=Ignore"),
        "minimal": render(
            helm, helm_home, "console.enabled=false", "networkPolicies.enabled=false",
            "admissionPolicy.enabled=false", "quotas=null"),
        "console-secret": render(helm, helm_home, "console.tls.mode=secret",
                                 "console.tls.secretName=console-cert"),
    }
    for name, objs in renderings.items():
        assert objs, name
        builtin = [o for o in objs if o["kind"] not in CRD_KINDS]
        for version in SCHEMA_VERSIONS:
            assert _validate(builtin, version) == [], (name, version)
    crds = {o["kind"] for o in renderings["everything"] if o["kind"] in CRD_KINDS}
    assert crds == CRD_KINDS


def test_values_set_what_they_name(helm: Path, helm_home: Path) -> None:
    objs = render(
        helm, helm_home, "webhook.replicas=3", "dispatcher.replicas=2",
        "webhook.failurePolicy=Ignore", "webhook.timeoutSeconds=3",
        "webhook.excludedNamespaces={kube-system,monitoring}",
        "webhook.resources.limits.memory=1Gi", "image.repository=registry.example.com/fairgate",
        "image.tag=9.9.9", "redis.storage=5Gi", "redis.storageClassName=fast",
        "priorityClasses.borrowed=500",
    )
    webhook = find(objs, "Deployment", "fairgate-webhook")
    assert webhook["spec"]["replicas"] == 3
    assert find(objs, "Deployment", "fairgate-dispatcher")["spec"]["replicas"] == 2
    (container,) = webhook["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/fairgate:9.9.9"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    for config in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(objs, config, "fairgate")["webhooks"]:
            assert hook["failurePolicy"] == "Ignore"
            assert hook["timeoutSeconds"] == 3
            if hook["name"].startswith("pods."):
                (expr,) = hook["namespaceSelector"]["matchExpressions"]
                assert expr["values"] == ["kube-system", "monitoring", "fairgate-system"]
    (claim,) = find(objs, "StatefulSet", "fairgate-redis")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert find(objs, "PriorityClass", "fairgate-borrowed")["value"] == 500


def test_tenants_come_from_values_and_parse_with_fairgates_schema(
    helm: Path, helm_home: Path
) -> None:
    values = {
        "platform": {
            "platformAdmins": {"groups": ["ops"]},
            "tenants": {
                "vision": {"weight": 3, "ceiling": {"gpuEquivalents": 8}, "nodePool": "a100"},
                "nlp": {"weight": 1, "ceiling": {"gpuEquivalents": 2},
                        "admins": {"users": ["bob@example.com"]}},
            },
            "onRedisUnavailable": "allow",
        },
        "quotas": {"vision": {"nominal": {"gpu": 4}, "defaultClass": "training"}},
    }
    objs = render(helm, helm_home, values=values)
    platform = parse_platform(find(objs, "ConfigMap", "fairgate-platform")["data"]["platform.yaml"])
    assert set(platform.tenants) == {"vision", "nlp"}
    assert platform.tenants["vision"].node_pool == "a100"
    assert platform.on_redis_unavailable == "allow"
    quotas = [o for o in of_kind(objs, "ConfigMap") if o["metadata"]["name"].startswith("quota-")]
    assert [q["metadata"]["name"] for q in quotas] == ["quota-vision"]
    assert quotas[0]["metadata"]["labels"]["fairgate.io/quota"] == "vision"
    assert parse_quota(quotas[0]["data"]["quota.yaml"], "vision").nominal == {"gpu": 4}


def test_a_chart_made_redis_password_matches_redis_secret(helm: Path, helm_home: Path) -> None:
    """Set `redis.password` and the chart writes the Secret `fairgate redis-secret` would:
    the password, and the ACL file with its SHA-256 (byte for byte)."""
    objs = render(helm, helm_home, "redis.password=correct-horse")
    secret = find(objs, "Secret", "fairgate-redis-auth")
    assert secret["stringData"] == {"password": "correct-horse",
                                    "users.acl": acl_file("correct-horse")}
    assert hashlib.sha256(b"correct-horse").hexdigest() in secret["stringData"]["users.acl"]
    assert not of_kind(render(helm, helm_home), "Secret")


def test_a_chart_generated_redis_password_is_random_and_matches_its_acl(
    helm: Path, helm_home: Path
) -> None:
    secrets = [find(render(helm, helm_home, "redis.generatePassword=true"), "Secret",
                    "fairgate-redis-auth")["stringData"] for _ in range(2)]
    for data in secrets:
        assert len(data["password"]) == 43 and data["password"].isalnum()
        assert data["users.acl"] == acl_file(data["password"])
    # without a cluster to read an earlier one from, each rendering makes a new one
    assert secrets[0]["password"] != secrets[1]["password"]


def test_console_tls_modes(helm: Path, helm_home: Path) -> None:
    def console(objs: list[Obj]) -> Obj:
        spec: Obj = find(objs, "Deployment", "fairgate-console")["spec"]["template"]["spec"]
        return spec

    own = console(render(helm, helm_home, "console.tls.mode=secret",
                         "console.tls.secretName=console-cert"))
    assert "initContainers" not in own
    tls = next(v for v in own["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "console-cert"
    objs = render(helm, helm_home, "console.tls.mode=cert-manager",
                  "console.tls.certManager.issuerRef.name=corp-ca")
    cert = find(objs, "Certificate", "fairgate-console")
    assert cert["spec"]["secretName"] == "fairgate-console-tls"
    assert "fairgate-console.fairgate-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}
    assert not [o for o in of_kind(objs, "Role") if o["metadata"]["name"] == "fairgate-console-tls"]
    assert "console" not in {o["metadata"]["name"] for o in of_kind(objs, "Deployment")}
    assert not [o for o in render(helm, helm_home, "console.enabled=false")
                if "console" in o["metadata"]["name"]]


def test_service_monitor_scrapes_the_webhook_over_tls(helm: Path, helm_home: Path) -> None:
    objs = render(helm, helm_home, "serviceMonitor.enabled=true",
                  "serviceMonitor.labels.release=prom")
    monitor = find(objs, "ServiceMonitor", "fairgate-webhook")
    service = find(objs, "Service", "fairgate-webhook")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "fairgate-webhook-tls",
                                                      "key": "ca.crt"}
    assert endpoint["tlsConfig"]["serverName"] == "fairgate-webhook.fairgate-system.svc"


@pytest.mark.parametrize(("sets", "message"), [
    (["webhook.failurePolicy=Maybe"],
     "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'"),
    (["redis.mode=cluster"],
     "at '/redis/mode': value must be one of 'standalone', 'sentinel'"),
    (["webhook.replica=3"], "at '/webhook': additional properties 'replica' not allowed"),
    (["webhook.replicas=0"], "at '/webhook/replicas': minimum: got 0, want 1"),
    (["platform.tenants.team-a.weight=0"],
     "at '/platform/tenants/team-a/weight': exclusiveMinimum: got 0, want 0"),
    (["platform.tenants.Team_C.weight=1"],
     "at '/platform/tenants': additional properties 'Team_C' not allowed"),
    (["platform.tenants.team-c.weight=1"],
     "at '/platform/tenants/team-c': missing property 'ceiling'"),
    (["platform.onRedisUnavailable=maybe"],
     "at '/platform/onRedisUnavailable': value must be one of 'deny', 'allow'"),
    (["quotas.team-a.nominal.gpu=-1"], "at '/quotas/team-a/nominal/gpu': minimum: got -1, want 0"),
    (["redis.storage=lots"], "at '/redis/storage'"),
    (["metrics.tenantLabels=hashed"], "at '/metrics/tenantLabels'"),
    (["console.tls.mode=acme"],
     "at '/console/tls/mode': value must be one of 'self-signed', 'secret', 'cert-manager'"),
])
def test_values_schema_refuses_bad_values(
    helm: Path, helm_home: Path, sets: list[str], message: str
) -> None:
    stderr = refused(helm, helm_home, *sets)
    assert "values don't meet the specifications of the schema(s)" in stderr
    assert message in stderr, stderr


def test_metrics_tenant_labels_are_the_operators_choice(helm: Path, helm_home: Path) -> None:
    """By default the webhook's /metrics names no tenant (no flag: the command's default);
    metrics.tenantLabels=names passes the flag."""
    def command(*sets: str) -> list[str]:
        webhook = find(render(helm, helm_home, *sets), "Deployment", "fairgate-webhook")
        (container,) = webhook["spec"]["template"]["spec"]["containers"]
        return [str(part) for part in container["command"]]

    assert "--metrics-tenant-labels" not in command()
    named = command("metrics.tenantLabels=names")
    assert named[named.index("--metrics-tenant-labels") + 1] == "names"


@pytest.mark.parametrize(("sets", "message"), [
    (["platform.tenants.vision.weight=1", "platform.tenants.vision.ceiling.gpuEquivalents=1",
      "quotas.team-c.nominal.gpu=1"],
     "quotas.team-c: no tenant team-c in platform.tenants"),
    (["quotas.team-c.nominal.gpu=1"],
     "quotas are set but platform.tenants is empty"),
    (["priorityClasses.borrowed=20000"],
     "priorityClasses: the order inference > training > borrowed must hold"),
    (["console.tls.mode=cert-manager"],
     "console.tls.mode=cert-manager needs console.tls.certManager.issuerRef.name"),
])
def test_checks_beyond_the_schema(
    helm: Path, helm_home: Path, sets: list[str], message: str
) -> None:
    assert message in refused(helm, helm_home, *sets)


def _schema() -> Obj:
    schema: Obj = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _aliases(model: Any) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def _required(model: Any) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items() if f.is_required()}


def test_schema_knows_exactly_fairgates_config_fields() -> None:
    """The schema's platform, tenant and quota keys are those of fairgate's own models, so
    that a value the webhook would refuse is refused at `helm install`, and no valid
    field is refused."""
    platform = _schema()["properties"]["platform"]
    assert set(platform["properties"]) == _aliases(PlatformConfig)
    assert set(platform.get("required", [])) == _required(PlatformConfig)
    (tenant,) = platform["properties"]["tenants"]["patternProperties"].values()
    assert set(tenant["properties"]) == _aliases(TenantSpec)
    assert set(tenant["required"]) == _required(TenantSpec)
    (quota,) = _schema()["properties"]["quotas"]["patternProperties"].values()
    assert set(quota["properties"]) == _aliases(QuotaSpec)
    assert set(quota.get("required", [])) == _required(QuotaSpec)


def test_every_default_value_is_in_the_schema() -> None:
    """values.yaml and values.schema.json name the same keys (no value escapes the
    check by being missing from the schema), two levels down."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    props = _schema()["properties"]
    for key, value in values.items():
        assert key in props, key
        if isinstance(value, dict) and "properties" in props[key]:
            assert set(value) <= set(props[key]["properties"]), key


def test_appversion_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject
    kustomization = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "fairgate", "newTag": chart["appVersion"]}]



def test_clusters_older_than_the_docs_minimum_are_refused(helm: Path, helm_home: Path) -> None:
    """docs/install.md: Kubernetes 1.30 or newer (matchConditions and the
    ValidatingAdmissionPolicy GA, the console's native sidecar on by default)."""
    args = ["template", "fairgate", str(CHART), "-n", "fairgate-system"]
    old = _run(helm, helm_home, *args, "--kube-version", "1.29.9")
    assert old.returncode != 0
    assert "chart requires kubeVersion: >=1.30.0-0" in old.stderr
    assert _run(helm, helm_home, *args, "--kube-version", "1.30.0").returncode == 0

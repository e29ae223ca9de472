"""ClusterConfigSource against a real kube-apiserver (tests/e2e harness), no mocks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.harness.controlplane import ControlPlane, ControlPlaneError, build_controlplane
from e2e.harness.manifests import apply, load_kustomization
from kubernetes import client, config
from prometheus_client import REGISTRY

from tenants.cluster import EVENT_REASON, ClusterConfigSource

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "fairgate-system"
PLATFORM = """\
platformAdmins: {groups: [platform-team]}
tenants:
  team-a: {weight: 2, ceiling: {gpuEquivalents: 24}, admins: {users: [alice]}}
  team-b: {weight: 1, ceiling: {gpuEquivalents: 8}}
"""


@pytest.fixture(scope="module")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        bin_dir = build_controlplane()
    except ControlPlaneError as error:
        pytest.fail(str(error))
    cp = ControlPlane(bin_dir, Path(tmp_path_factory.mktemp("cp-tenants")))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def core(controlplane: ControlPlane) -> Any:
    api = client.CoreV1Api(controlplane.admin)
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    return api


def _configmap(name: str, key: str, text: str, labels: dict[str, str] | None = None) -> Any:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, namespace=NS,
                                                           labels=labels),
                              data={key: text})


def _quota(text: str, tenant: str = "team-a") -> Any:
    return _configmap(f"quota-{tenant}", "quota.yaml", text, {"fairgate.io/quota": tenant})


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _nominal(source: ClusterConfigSource, tenant: str = "team-a") -> dict[str, int]:
    found = source.config.tenant(tenant)
    return dict(found.nominal) if found is not None else {}


def _failures(obj: str) -> float:
    return REGISTRY.get_sample_value("fairgate_config_reload_failures_total",
                                     {"configmap": obj}) or 0.0


@pytest.fixture(scope="module")
def source(controlplane: ControlPlane, core: Any) -> Iterator[ClusterConfigSource]:
    core.create_namespaced_config_map(NS, _configmap("fairgate-platform", "platform.yaml",
                                                     PLATFORM))
    core.create_namespaced_config_map(NS, _quota("nominal: {gpu: 8}\n"))
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name="team-a-dev", labels={"fairgate.io/tenant": "team-a"})))
    watcher = ClusterConfigSource(controlplane.admin, watch_timeout_seconds=2)
    watcher.start()
    try:
        assert watcher.wait_ready(60), watcher.last_error
        yield watcher
    finally:
        watcher.close()


def test_first_full_load(source: ClusterConfigSource) -> None:
    assert source.ready and source.last_error == {}
    assert source.config.tenant_of_namespace("team-a-dev") == "team-a"
    assert _nominal(source) == {"gpu": 8}


def test_valid_edit_is_hot_reloaded_across_watch_restarts(
    source: ClusterConfigSource, core: Any,
) -> None:
    time.sleep(5)  # outlive two server-side watch timeouts (2 s): the watch must resume
    core.replace_namespaced_config_map("quota-team-a", NS, _quota("nominal: {gpu: 12}\n"))
    _wait(lambda: _nominal(source) == {"gpu": 12}, "the new nominal")
    core.create_namespaced_config_map(NS, _quota("nominal: {gpu: 2}\n", "team-b"))
    _wait(lambda: _nominal(source, "team-b") == {"gpu": 2}, "team-b's quota")


def test_broken_quota_keeps_the_old_one_and_is_reported(
    source: ClusterConfigSource, core: Any,
) -> None:
    obj = f"{NS}/quota-team-a"
    before = _nominal(source)
    failures = _failures(obj)
    core.replace_namespaced_config_map("quota-team-a", NS, _quota("nominal: {gpu: 8\n"))
    _wait(lambda: obj in source.last_error, "the error to be reported")
    assert "YAML syntax error" in source.last_error[obj]
    assert _nominal(source) == before
    assert _failures(obj) == failures + 1

    def warned() -> bool:
        events = core.list_namespaced_event(
            NS, field_selector="involvedObject.kind=ConfigMap,involvedObject.name=quota-team-a")
        return any(e.reason == EVENT_REASON and e.type == "Warning"
                   and "YAML syntax error" in e.message for e in events.items)

    _wait(warned, "a Warning Event on the ConfigMap")
    core.replace_namespaced_config_map("quota-team-a", NS, _quota("nominal: {gpu: 6}\n"))
    _wait(lambda: _nominal(source) == {"gpu": 6}, "the fixed quota")
    assert obj not in source.last_error


def test_broken_platform_keeps_the_old_one(source: ClusterConfigSource, core: Any) -> None:
    obj = f"{NS}/fairgate-platform"
    core.replace_namespaced_config_map(
        "fairgate-platform", NS, _configmap("fairgate-platform", "platform.yaml",
                                            PLATFORM + "tenantz: {}\n"))
    _wait(lambda: obj in source.last_error, "the platform error")
    assert "tenantz: unknown key" in source.last_error[obj]
    assert source.config.tenant("team-a") is not None
    core.replace_namespaced_config_map(
        "fairgate-platform", NS, _configmap("fairgate-platform", "platform.yaml",
                                            PLATFORM.replace("weight: 2", "weight: 4")))
    _wait(lambda: obj not in source.last_error, "the platform fix")
    team_a = source.config.tenant("team-a")
    assert team_a is not None and team_a.weight == 4


def test_lowered_ceiling_reports_the_quota_it_breaks(
    source: ClusterConfigSource, core: Any,
) -> None:
    quota_obj = f"{NS}/quota-team-a"
    before = _nominal(source)
    assert before == {"gpu": 6}
    core.replace_namespaced_config_map(
        "fairgate-platform", NS, _configmap("fairgate-platform", "platform.yaml",
                                            PLATFORM.replace("24", "5")))
    _wait(lambda: quota_obj in source.last_error, "the quota to be re-checked")
    assert "exceeds the ceiling of 5 GPU-eq" in source.last_error[quota_obj]
    assert _nominal(source) == before

    def warned_on_quota() -> bool:
        events = core.list_namespaced_event(
            NS, field_selector="involvedObject.name=quota-team-a,reason=" + EVENT_REASON)
        return any("exceeds the ceiling" in e.message for e in events.items)

    _wait(warned_on_quota, "the Event on quota-team-a (not on fairgate-platform)")
    core.replace_namespaced_config_map(
        "fairgate-platform", NS, _configmap("fairgate-platform", "platform.yaml", PLATFORM))
    _wait(lambda: quota_obj not in source.last_error, "the quota to be accepted again")


def test_namespace_labels_follow_the_cluster(source: ClusterConfigSource, core: Any) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name="team-b-prod", labels={"fairgate.io/tenant": "team-b"})))
    _wait(lambda: source.config.tenant_of_namespace("team-b-prod") == "team-b", "new namespace")
    core.patch_namespace("team-b-prod", {"metadata": {"labels": {"fairgate.io/tenant": None}}})
    _wait(lambda: source.config.tenant_of_namespace("team-b-prod") is None, "label removal")


def test_unrelated_configmaps_are_ignored(source: ClusterConfigSource, core: Any) -> None:
    generation = source.generation
    core.create_namespaced_config_map(NS, _configmap("settings", "x", "y"))
    core.replace_namespaced_config_map("quota-team-b", NS, _quota("nominal: {gpu: 3}\n",
                                                                  "team-b"))
    _wait(lambda: _nominal(source, "team-b") == {"gpu": 3}, "team-b's update")
    assert source.generation == generation + 1


def test_a_second_source_starts_from_a_full_list(
    controlplane: ControlPlane, source: ClusterConfigSource,
) -> None:
    fresh = ClusterConfigSource(controlplane.admin, watch_timeout_seconds=2)
    assert not fresh.ready
    fresh.start()
    try:
        assert fresh.wait_ready(60)
        assert fresh.config.platform == source.config.platform
        assert dict(fresh.config.quotas) == dict(source.config.quotas)
    finally:
        fresh.close()


RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding")


def test_the_shipped_rbac_suffices_for_the_webhook_service_account(
    controlplane: ControlPlane, core: Any, source: ClusterConfigSource,
) -> None:
    repo = Path(__file__).resolve().parents[2]
    objects = [o for o in load_kustomization(repo / "manifests") if o["kind"] in RBAC_KINDS]
    apply(controlplane.admin, objects)
    kubeconfig = controlplane.token_kubeconfig(NS, "fairgate-webhook")
    limited = ClusterConfigSource(config.new_client_from_config(config_file=str(kubeconfig)),
                                  watch_timeout_seconds=2)
    limited.start()
    try:
        assert limited.wait_ready(60), limited.last_error
        assert limited.config.platform == source.config.platform
        before = _nominal(limited, "team-b")
        core.replace_namespaced_config_map("quota-team-b", NS,
                                           _quota("nominal: {gpu: 100}\n", "team-b"))
        _wait(lambda: f"{NS}/quota-team-b" in limited.last_error, "the ceiling error")

        def warned() -> bool:
            events = core.list_namespaced_event(
                NS, field_selector="involvedObject.name=quota-team-b,reason=" + EVENT_REASON)
            return bool(events.items)

        _wait(warned, "an Event posted with the service account's rights")
        assert _nominal(limited, "team-b") == before
    finally:
        limited.close()


def test_without_rights_it_stays_unready_and_says_why(controlplane: ControlPlane) -> None:
    nobody = ClusterConfigSource(controlplane.client_for("nobody@example.com"),
                                 watch_timeout_seconds=2, max_backoff=1)
    nobody.start()
    try:
        _wait(lambda: f"{NS}/configmaps" in nobody.last_error, "the list failure")
        assert not nobody.ready
        assert "403" in nobody.last_error[f"{NS}/configmaps"]
        assert "RBAC" in nobody.last_error[f"{NS}/configmaps"]
    finally:
        nobody.close()


def test_recovers_once_rights_are_granted(controlplane: ControlPlane, core: Any) -> None:
    user = "late@example.com"
    late = ClusterConfigSource(controlplane.client_for(user), watch_timeout_seconds=2,
                               max_backoff=1)
    late.start()
    try:
        _wait(lambda: f"{NS}/configmaps" in late.last_error, "the 403")
        rbac = client.RbacAuthorizationV1Api(controlplane.admin)
        subject = [client.RbacV1Subject(kind="User", name=user,
                                        api_group="rbac.authorization.k8s.io")]
        rbac.create_namespaced_role(NS, client.V1Role(
            metadata=client.V1ObjectMeta(name="late-config"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"],
                                       verbs=["list", "watch"])]))
        rbac.create_namespaced_role_binding(NS, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="late-config"), subjects=subject,
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                      name="late-config")))
        rbac.create_cluster_role(client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name="late-namespaces"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["namespaces"],
                                       verbs=["list", "watch"])]))
        rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name="late-namespaces"), subjects=subject,
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                      kind="ClusterRole", name="late-namespaces")))
        assert late.wait_ready(60), late.last_error
        _wait(lambda: not any(k in late.last_error for k in (f"{NS}/configmaps", "namespaces")),
              "the list errors to clear")
        assert late.config.tenant("team-a") is not None
    finally:
        late.close()

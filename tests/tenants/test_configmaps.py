"""ConfigMap admission: real AdmissionReview v1 requests for fairgate's ConfigMaps."""

from __future__ import annotations

import json
import uuid
from datetime import date
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.chain import AuditRecord
from tenants.configmaps import ConfigMapVerdict, field_diff, review_configmap_request
from tenants.models import FairgateConfig
from tenants.schema import parse_platform, parse_quota

PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team], users: []}
tenants:
  team-a:
    weight: 2
    ceiling: {gpuEquivalents: 24}
    admins: {groups: [team-a-admins], users: [alice@example.com]}
  team-b:
    weight: 1
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-b-admins], users: [bob@example.com]}
"""
QUOTA_A = "nominal: {gpu: 8, mig-1g.5gb: 14}\nborrowLimit: {gpuEquivalents: 4}\n"
QUOTA_B = "nominal: {gpu: 4}\n"

TENANT_A_ADMIN = ("alice@example.com", ["system:authenticated"])
TENANT_A_GROUP_MEMBER = ("carol@example.com", ["team-a-admins", "system:authenticated"])
TENANT_B_ADMIN = ("bob@example.com", ["team-b-admins", "system:authenticated"])
PLATFORM_ADMIN = ("pat@example.com", ["platform-team", "system:authenticated"])
STRANGER = ("mallory@example.com", ["system:authenticated"])


@pytest.fixture
def current() -> FairgateConfig:
    platform = parse_platform(PLATFORM_YAML)
    return FairgateConfig(
        platform=platform,
        quotas={"team-a": parse_quota(QUOTA_A, "team-a", platform),
                "team-b": parse_quota(QUOTA_B, "team-b", platform)},
    )


def _configmap(name: str, data: dict[str, str] | None, labels: dict[str, str] | None,
               namespace: str = "fairgate-system") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "4242",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update",
                               "apiVersion": "v1", "fieldsType": "FieldsV1"}],
        },
    }
    if labels is not None:
        obj["metadata"]["labels"] = labels
    if data is not None:
        obj["data"] = data
    return obj


def admission_review(operation: str, name: str, who: tuple[str, list[str]],
                     new: dict[str, str] | None = None, old: dict[str, str] | None = None,
                     labels: dict[str, str] | None = None,
                     namespace: str = "fairgate-system") -> dict[str, Any]:
    """An AdmissionReview v1 request for a ConfigMap, as the API server sends it."""
    user, groups = who
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions",
               "DELETE": "DeleteOptions"}[operation]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "requestKind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "requestResource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user, "uid": str(uuid.uuid4()), "groups": groups,
                         "extra": {"authentication.kubernetes.io/credential-id": ["X509=ab"]}},
            "object": (_configmap(name, new, labels, namespace)
                       if operation != "DELETE" else None),
            "oldObject": (_configmap(name, old, labels, namespace)
                          if operation != "CREATE" else None),
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
        },
    }
    parsed: dict[str, Any] = json.loads(json.dumps(review))
    return parsed


def review(current: FairgateConfig, body: dict[str, Any],
           usage: dict[str, int] | None = None) -> ConfigMapVerdict:
    return review_configmap_request(body["request"], current, usage)


def quota_update(who: tuple[str, list[str]], text: str, tenant: str = "team-a",
                 old: str = QUOTA_A, label: str | None = None) -> dict[str, Any]:
    return admission_review("UPDATE", f"quota-{tenant}", who, new={"quota.yaml": text},
                            old={"quota.yaml": old},
                            labels={"fairgate.io/quota": label or tenant})


@pytest.mark.parametrize("who", [TENANT_A_ADMIN, TENANT_A_GROUP_MEMBER, PLATFORM_ADMIN])
def test_own_edit_within_ceiling_is_allowed_with_diff(
    current: FairgateConfig, who: tuple[str, list[str]],
) -> None:
    verdict = review(current, quota_update(
        who, "nominal: {gpu: 16, mig-1g.5gb: 14}\nborrowLimit: {gpuEquivalents: 4}\n"))
    assert verdict.allowed, verdict.message
    assert verdict.tenant == "team-a" and verdict.warnings == ()
    assert verdict.audit_diff == {"nominal.gpu": {"before": 8, "after": 16}}


def test_edit_above_ceiling_is_denied(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(TENANT_A_ADMIN, "nominal: {gpu: 25}\n"))
    assert not verdict.allowed and verdict.audit_diff is None
    assert "nominal: 25.00 GPU-eq exceeds the ceiling of 24 GPU-eq" in verdict.message
    assert "quota-team-a" in verdict.message


def test_edit_exactly_at_ceiling_is_allowed(current: FairgateConfig) -> None:
    assert review(current, quota_update(TENANT_A_ADMIN, "nominal: {gpu: 24}\n")).allowed


@pytest.mark.parametrize("who", [TENANT_B_ADMIN, STRANGER])
def test_other_tenants_admin_and_stranger_are_denied(
    current: FairgateConfig, who: tuple[str, list[str]],
) -> None:
    verdict = review(current, quota_update(who, "nominal: {gpu: 1}\n"))
    assert not verdict.allowed
    assert f"user {who[0]!r}" in verdict.message
    assert "may not change fairgate-system/quota-team-a" in verdict.message
    assert "only team-a's admins or platform admins may" in verdict.message


def test_stranger_may_not_create_a_quota(current: FairgateConfig) -> None:
    body = admission_review("CREATE", "quota-team-c", STRANGER, new={"quota.yaml": "{}"},
                            labels={"fairgate.io/quota": "team-c"})
    verdict = review(current, body)
    assert not verdict.allowed and "'team-c' is not defined in fairgate-platform" in verdict.message


@pytest.mark.parametrize("who", [TENANT_A_ADMIN, TENANT_B_ADMIN, STRANGER])
def test_platform_configmap_edit_by_non_platform_admin_is_denied(
    current: FairgateConfig, who: tuple[str, list[str]],
) -> None:
    body = admission_review("UPDATE", "fairgate-platform", who,
                            new={"platform.yaml": PLATFORM_YAML.replace("24", "240")},
                            old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert not verdict.allowed
    assert "may not change fairgate-system/fairgate-platform: only platform admins" in (
        verdict.message)


def test_platform_edit_by_platform_admin_is_allowed_with_diff(current: FairgateConfig) -> None:
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": PLATFORM_YAML.replace("weight: 2", "weight: 3")},
                            old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert verdict.allowed, verdict.message
    assert verdict.audit_diff == {"tenants.team-a.weight": {"before": 2, "after": 3}}


def test_malformed_yaml_is_denied_with_the_line(current: FairgateConfig) -> None:
    text = "nominal:\n  gpu: 4\n  mig-1g.5gb: [1, 2\nborrowLimit: {}\n"
    verdict = review(current, quota_update(TENANT_A_ADMIN, text))
    assert not verdict.allowed
    assert "line 4" in verdict.message and "YAML syntax error" in verdict.message


def test_malformed_platform_yaml_is_denied_with_the_line(current: FairgateConfig) -> None:
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": "tenants:\n  team-a: {weight: 2\n"},
                            old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert not verdict.allowed and "line 3" in verdict.message


def test_unknown_key_is_denied_naming_it(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(
        TENANT_A_ADMIN, "nominal: {gpu: 4}\nborrowlimit: {gpuEquivalents: 2}\n"))
    assert not verdict.allowed
    assert "borrowlimit: unknown key: remove it or check its spelling" in verdict.message


def test_unknown_resource_and_negative_numbers_are_denied(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(TENANT_A_ADMIN, "nominal: {gpu: -1, tpu: 2}\n"))
    assert not verdict.allowed
    assert "nominal" in verdict.message


def test_delete_by_tenant_admin_is_denied(current: FairgateConfig) -> None:
    body = admission_review("DELETE", "quota-team-a", TENANT_A_ADMIN, old={"quota.yaml": QUOTA_A},
                            labels={"fairgate.io/quota": "team-a"})
    verdict = review(current, body)
    assert not verdict.allowed
    assert "may not delete fairgate-system/quota-team-a: only platform admins" in verdict.message


def test_delete_by_platform_admin_is_allowed_with_diff(current: FairgateConfig) -> None:
    body = admission_review("DELETE", "quota-team-a", PLATFORM_ADMIN, old={"quota.yaml": QUOTA_A},
                            labels={"fairgate.io/quota": "team-a"})
    verdict = review(current, body)
    assert verdict.allowed
    assert verdict.audit_diff is not None
    assert verdict.audit_diff["nominal.gpu"] == {"before": 8, "after": None}


def test_platform_delete_by_tenant_admin_is_denied(current: FairgateConfig) -> None:
    body = admission_review("DELETE", "fairgate-platform", TENANT_A_ADMIN,
                            old={"platform.yaml": PLATFORM_YAML})
    assert not review(current, body).allowed


def test_quota_below_usage_is_allowed_with_a_short_warning(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(TENANT_A_ADMIN, "nominal: {gpu: 2}\n"),
                     usage={"team-a": 70})
    assert verdict.allowed
    (warning,) = verdict.warnings
    assert len(warning) <= 120
    assert "2.00 GPU-eq is below current usage 10.00" in warning
    assert "nothing is evicted" in warning


def test_no_warning_when_usage_fits(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(TENANT_A_ADMIN, "nominal: {gpu: 10}\n"),
                     usage={"team-a": 70})
    assert verdict.allowed and verdict.warnings == ()


@pytest.mark.parametrize("labels", [None, {"fairgate.io/quota": "team-b"}, {"app": "x"}])
def test_quota_label_must_match_the_name(
    current: FairgateConfig, labels: dict[str, str] | None,
) -> None:
    body = admission_review("CREATE", "quota-team-a", TENANT_A_ADMIN,
                            new={"quota.yaml": QUOTA_A}, labels=labels)
    verdict = review(current, body)
    assert not verdict.allowed
    assert "metadata.labels.fairgate.io/quota: must be 'team-a'" in verdict.message
    assert "set label 'fairgate.io/quota: team-a'" in verdict.message


def test_missing_and_extra_data_keys_are_denied(current: FairgateConfig) -> None:
    body = admission_review("UPDATE", "quota-team-a", TENANT_A_ADMIN,
                            new={"quota.yml": QUOTA_A}, old={"quota.yaml": QUOTA_A},
                            labels={"fairgate.io/quota": "team-a"})
    verdict = review(current, body)
    assert not verdict.allowed
    assert "data: missing key 'quota.yaml'" in verdict.message
    assert "data.quota.yml: unknown key: quota-team-a holds only 'quota.yaml'" in verdict.message


def test_platform_edit_lowering_a_ceiling_below_a_quota_is_denied_naming_the_tenant(
    current: FairgateConfig,
) -> None:
    lowered = PLATFORM_YAML.replace("gpuEquivalents: 24", "gpuEquivalents: 9")
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": lowered}, old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert not verdict.allowed
    assert "tenants.team-a.ceiling.gpuEquivalents: 9 is below the nominal quota of tenant " \
           "'team-a' (10.00 GPU-eq in quota-team-a)" in verdict.message


def test_platform_edit_lowering_a_ceiling_below_nominal_plus_borrow_limit_is_denied(
    current: FairgateConfig,
) -> None:
    lowered = PLATFORM_YAML.replace("gpuEquivalents: 24", "gpuEquivalents: 12")
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": lowered}, old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert not verdict.allowed
    assert "tenants.team-a.ceiling.gpuEquivalents: 12 is below nominal + borrowLimit of tenant " \
           "'team-a' (10.00 + 4.00 = 14.00 GPU-eq in quota-team-a): lower that quota's " \
           "borrowLimit first" in verdict.message
    exact = PLATFORM_YAML.replace("gpuEquivalents: 24", "gpuEquivalents: 14")
    assert review(current, admission_review(
        "UPDATE", "fairgate-platform", PLATFORM_ADMIN, new={"platform.yaml": exact},
        old={"platform.yaml": PLATFORM_YAML})).allowed


def test_edit_raising_borrow_limit_above_the_ceiling_is_denied(current: FairgateConfig) -> None:
    verdict = review(current, quota_update(
        TENANT_A_ADMIN, "nominal: {gpu: 8, mig-1g.5gb: 14}\nborrowLimit: {gpuEquivalents: 15}\n"))
    assert not verdict.allowed and verdict.audit_diff is None
    assert "nominal 10.00 + borrowLimit 15.00 GPU-eq = 25.00 exceeds team-a's ceiling 24.00: " \
           "lower borrowLimit to at most 14.00" in verdict.message


def test_platform_edit_removing_a_tenant_with_a_quota_is_denied(current: FairgateConfig) -> None:
    without_b = PLATFORM_YAML[: PLATFORM_YAML.index("  team-b:")]
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": without_b}, old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert not verdict.allowed and "tenants.team-b: removed while quota-team-b exists" in (
        verdict.message)


def test_platform_admin_locking_themselves_out_is_warned(current: FairgateConfig) -> None:
    body = admission_review("UPDATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": PLATFORM_YAML.replace("platform-team", "ops")},
                            old={"platform.yaml": PLATFORM_YAML})
    verdict = review(current, body)
    assert verdict.allowed and "no longer a platform admin" in verdict.warnings[0]


def test_bootstrap_by_cluster_superuser_on_empty_config() -> None:
    empty = FairgateConfig(platform=parse_platform(""))
    body = admission_review("CREATE", "fairgate-platform", ("kubernetes-admin", ["system:masters"]),
                            new={"platform.yaml": PLATFORM_YAML})
    assert review(empty, body).allowed
    body = admission_review("CREATE", "fairgate-platform", PLATFORM_ADMIN,
                            new={"platform.yaml": PLATFORM_YAML})
    assert not review(empty, body).allowed


def test_fairgate_service_account_may_write_quota(current: FairgateConfig) -> None:
    sa = ("system:serviceaccount:fairgate-system:fairgate-webhook",
          ["system:serviceaccounts", "system:serviceaccounts:fairgate-system"])
    assert review(current, quota_update(sa, "nominal: {gpu: 3}\n")).allowed
    other_sa = ("system:serviceaccount:team-a-dev:default", ["system:serviceaccounts"])
    assert not review(current, quota_update(other_sa, "nominal: {gpu: 3}\n")).allowed


@pytest.mark.parametrize(("name", "namespace"), [
    ("quota-team-a", "team-a-dev"), ("fairgate-platform", "default"),
    ("settings", "fairgate-system"), ("quota-", "fairgate-system"),
])
def test_other_configmaps_are_not_ours(current: FairgateConfig, name: str, namespace: str) -> None:
    body = admission_review("UPDATE", name, STRANGER, new={"x": "y"}, old={"x": "z"},
                            namespace=namespace)
    verdict = review(current, body)
    assert verdict.allowed and not verdict.ours


def test_diff_with_yaml_dates_goes_into_an_audit_record() -> None:
    diff = field_diff({"a": {"b": 1}, "since": "x"}, {"a": {"b": 2, "c": [1]},
                                                      "since": date(2026, 1, 2)})
    assert diff == {"a.b": {"before": 1, "after": 2}, "a.c": {"before": None, "after": [1]},
                    "since": {"before": "x", "after": date(2026, 1, 2)}}
    record = AuditRecord(decision="quota-change", diff=diff)
    assert '"after":"2026-01-02"' in record.to_json()


USERS = ["alice@example.com", "bob@example.com", "pat@example.com", "mallory@example.com",
         "system:serviceaccount:fairgate-system:fairgate-dispatcher",
         "system:serviceaccount:fairgate-system:fairgate-other"]
GROUPS = ["team-a-admins", "team-b-admins", "platform-team", "system:masters",
          "system:authenticated", "team-a-admin"]


@settings(max_examples=60, deadline=None)
@given(user=st.sampled_from(USERS), groups=st.lists(st.sampled_from(GROUPS), unique=True),
       operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
def test_who_may_write_team_a_quota(user: str, groups: list[str], operation: str) -> None:
    platform = parse_platform(PLATFORM_YAML)
    current = FairgateConfig(platform=platform,
                             quotas={"team-a": parse_quota(QUOTA_A, "team-a", platform)})
    body = admission_review(operation, "quota-team-a", (user, groups),
                            new={"quota.yaml": "nominal: {gpu: 2}\n"},
                            old={"quota.yaml": QUOTA_A}, labels={"fairgate.io/quota": "team-a"})
    platform_admin = ("platform-team" in groups or "system:masters" in groups
                      or user.endswith(":fairgate-dispatcher"))
    tenant_admin = user == "alice@example.com" or "team-a-admins" in groups
    expected = platform_admin or (tenant_admin and operation != "DELETE")
    verdict = review(current, body)
    assert verdict.allowed == expected, verdict.message
    if not expected:
        assert f"user {user!r}" in verdict.message


def _generate_name_create(prefix: str, who: tuple[str, list[str]],
                          labels: dict[str, str] | None) -> dict[str, Any]:
    """A CREATE with ``generateName``: no name in the request nor in the object."""
    body = admission_review("CREATE", "", who, new={"quota.yaml": "nominal: {gpu: 24}\n"},
                            labels=labels)
    metadata = body["request"]["object"]["metadata"]
    del metadata["name"]
    metadata["generateName"] = prefix
    return body


@pytest.mark.parametrize(("prefix", "labels"), [
    ("quota-", None),
    ("quota-team-a-", {"fairgate.io/quota": "team-a"}),
    ("cache-", {"fairgate.io/quota": "team-a"}),
])
@pytest.mark.parametrize("who", [TENANT_A_ADMIN, PLATFORM_ADMIN, STRANGER])
def test_generate_name_quota_creates_are_refused_asking_for_an_explicit_name(
    current: FairgateConfig, prefix: str, labels: dict[str, str] | None,
    who: tuple[str, list[str]],
) -> None:
    verdict = review(current, _generate_name_create(prefix, who, labels))
    assert verdict.ours and not verdict.allowed
    tenant = (labels or {}).get("fairgate.io/quota")
    assert verdict.tenant == tenant
    assert ("quota ConfigMaps must be created with an explicit name: set metadata.name to "
            f"quota-{tenant or '<tenant>'} instead of generateName {prefix!r}") in verdict.message


def test_generate_name_of_other_configmaps_is_not_ours(current: FairgateConfig) -> None:
    verdict = review(current, _generate_name_create("cache-", STRANGER, {"app": "x"}))
    assert verdict.ours is False and verdict.allowed


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_quota_label_on_another_configmap_is_refused(
    current: FairgateConfig, operation: str,
) -> None:
    body = admission_review(operation, "team-a-notes", PLATFORM_ADMIN, new={"k": "v"},
                            old={"k": "v"}, labels={"fairgate.io/quota": "team-a"})
    verdict = review(current, body)
    assert verdict.ours and not verdict.allowed and verdict.tenant == "team-a"
    assert ("the label fairgate.io/quota is reserved for quota ConfigMaps named "
            "quota-<tenant> in fairgate-system: remove it from 'team-a-notes', or name the "
            "ConfigMap quota-team-a") in verdict.message
    elsewhere = admission_review(operation, "team-a-notes", STRANGER, new={"k": "v"},
                                 old={"k": "v"}, labels={"fairgate.io/quota": "team-a"},
                                 namespace="team-a-dev")
    assert review(current, elsewhere).ours is False
    delete = admission_review("DELETE", "team-a-notes", STRANGER, old={"k": "v"},
                              labels={"fairgate.io/quota": "team-a"})
    assert review(current, delete).ours is False

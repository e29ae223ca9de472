"""Least privilege: every grant of every fairgate subject, and nothing more."""

from __future__ import annotations

import itertools

import pytest
from manifest_objects import Obj, find, of_kind

from tenants.schema import parse_platform

NS = "fairgate-system"
WEBHOOK = ("ServiceAccount", "fairgate-webhook", NS)
DISPATCHER = ("ServiceAccount", "fairgate-dispatcher", NS)
CONSOLE = ("ServiceAccount", "fairgate-console", NS)
TEAM_A_ADMINS = ("Group", "team-a-admins", None)
ALICE = ("User", "alice@example.com", None)

Subject = tuple[str, str, str | None]
# (namespace the grant is limited to or None for cluster-wide, API group,
#  resource, verb, resource name or None for any)
Grant = tuple[str | None, str, str, str, str | None]

ROLE_KINDS = ("Role", "ClusterRole")


def _subject_of(entry: Obj) -> Subject:
    return (entry["kind"], entry["name"], entry.get("namespace"))


def grants(objs: list[Obj], subject: Subject) -> set[Grant]:
    """Everything ``subject`` may do, flattened from the bindings in ``objs``."""
    out: set[Grant] = set()
    for binding in of_kind(objs, "RoleBinding") + of_kind(objs, "ClusterRoleBinding"):
        if subject not in {_subject_of(s) for s in binding.get("subjects", [])}:
            continue
        scope = binding["metadata"].get("namespace")  # None for ClusterRoleBinding
        ref = binding["roleRef"]
        role = find(objs, ref["kind"], ref["name"])
        if ref["kind"] == "Role":
            assert role["metadata"]["namespace"] == scope
        for rule in role.get("rules", []):
            names = rule.get("resourceNames") or [None]
            for group, resource, verb, name in itertools.product(
                rule.get("apiGroups", []), rule.get("resources", []), rule["verbs"], names
            ):
                out.add((scope, group, resource, verb, name))
    return out


def can(
    objs: list[Obj],
    subject: Subject,
    verb: str,
    resource: str,
    *,
    group: str = "",
    name: str | None = None,
    namespace: str | None = None,
) -> bool:
    """RBAC's answer for one request (``name`` None: list, watch, create)."""
    for scope, g, r, v, n in grants(objs, subject):
        if scope is not None and scope != namespace:
            continue
        if (g, r, v) == (group, resource, verb) and (n is None or n == name):
            return True
    return False


def _read(group: str, resource: str) -> set[Grant]:
    return {(None, group, resource, v, None) for v in ("get", "list", "watch")}


COMMON: set[Grant] = (
    _read("", "pods")
    | _read("", "nodes")
    | _read("", "namespaces")
    | _read("scheduling.k8s.io", "priorityclasses")
    | _read("resource.k8s.io", "deviceclasses")
    | _read("resource.k8s.io", "resourceclaimtemplates")
    | _read("resource.k8s.io", "resourceclaims")
    | {(None, "resource.k8s.io", "resourceslices", v, None) for v in ("list", "watch")}
    | _read("batch", "jobs")
    | _read("jobset.x-k8s.io", "jobsets")
    | _read("scheduling.k8s.io", "podgroups")
    | _read("scheduling.x-k8s.io", "podgroups")
    | _read("scheduling.volcano.sh", "podgroups")
    | {(NS, "", "configmaps", v, None) for v in ("get", "list", "watch")}
    | {(None, g, "events", v, None) for g in ("", "events.k8s.io") for v in ("create", "patch")}
)
EXPECTED: dict[Subject, set[Grant]] = {
    WEBHOOK: COMMON
    | {
        (None, "admissionregistration.k8s.io", r, v, "fairgate")
        for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for v in ("get", "patch")
    }
    | {(NS, "", "secrets", "create", None)}
    | {(NS, "", "secrets", v, s) for v in ("get", "update", "patch")
       for s in ("fairgate-webhook-tls", "fairgate-redis-auth")},
    DISPATCHER: COMMON | {(None, "", "pods", "patch", None),
                          # reclaim evicts through the Eviction API: a create on the
                          # pods/eviction subresource (PDBs and grace periods hold), never
                          # a delete of the pod
                          (None, "", "pods/eviction", "create", None),
                          # autoscaling (provisioningRequest mode): the request and its
                          # templates are owned by their pods, so the garbage collector
                          # deletes them; the dispatcher deletes nothing
                          (None, "", "podtemplates", "create", None)}
    | {(None, "autoscaling.x-k8s.io", "provisioningrequests", v, None)
       for v in ("create", "get", "list", "watch")},
    # TokenReview and SubjectAccessReview, and reads: the console's access checks; its
    # own certificate Secret (the TLS sidecar creates and renews it).
    CONSOLE: {(None, "authentication.k8s.io", "tokenreviews", "create", None),
              (None, "authorization.k8s.io", "subjectaccessreviews", "create", None)}
    | _read("", "namespaces")
    | {(NS, "", "configmaps", v, None) for v in ("get", "list", "watch")}
    | {(NS, "", "secrets", "create", None)}
    | {(NS, "", "secrets", v, "fairgate-console-tls") for v in ("get", "update", "patch")},
}


@pytest.mark.parametrize("subject", [WEBHOOK, DISPATCHER, CONSOLE],
                         ids=["webhook", "dispatcher", "console"])
def test_exact_grants(base: list[Obj], subject: Subject) -> None:
    """A new permission must be added here on purpose, or this fails."""
    assert grants(base, subject) == EXPECTED[subject]


def _all_roles(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in ROLE_KINDS]


@pytest.mark.parametrize("which", ["base", "tenant_admin"])
def test_no_wildcards_or_escalation(which: str, request: pytest.FixtureRequest) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    roles = _all_roles(objs)
    assert roles
    for role in roles:
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, role["metadata"]["name"]
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], field)
            assert not {"escalate", "bind", "impersonate", "delete", "deletecollection"} & set(
                rule["verbs"]
            ), role["metadata"]["name"]
        assert "aggregationRule" not in role


def test_only_the_dispatcher_patches_pods(base: list[Obj], tenant_admin: list[Obj]) -> None:
    objs = base + tenant_admin
    subjects = {
        _subject_of(s)
        for b in of_kind(objs, "RoleBinding") + of_kind(objs, "ClusterRoleBinding")
        for s in b["subjects"]
    }
    assert DISPATCHER in subjects and WEBHOOK in subjects and TEAM_A_ADMINS in subjects
    for subject in subjects:
        for verb in ("patch", "update"):
            allowed = can(objs, subject, verb, "pods", name="p", namespace="team-a-dev")
            assert allowed is (subject == DISPATCHER and verb == "patch"), (subject, verb)


def test_webhook_configurations_only_by_name(base: list[Obj]) -> None:
    group = "admissionregistration.k8s.io"
    for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert can(base, WEBHOOK, "patch", resource, group=group, name="fairgate")
        assert not can(base, WEBHOOK, "patch", resource, group=group, name="other-webhook")
        assert not can(base, WEBHOOK, "list", resource, group=group)
        assert not can(base, DISPATCHER, "patch", resource, group=group, name="fairgate")


def test_secrets(base: list[Obj]) -> None:
    tls = "fairgate-webhook-tls"
    assert can(base, WEBHOOK, "create", "secrets", namespace=NS)
    assert can(base, WEBHOOK, "get", "secrets", name=tls, namespace=NS)
    assert can(base, WEBHOOK, "patch", "secrets", name=tls, namespace=NS)
    assert not can(base, WEBHOOK, "get", "secrets", name="other", namespace=NS)
    assert not can(base, WEBHOOK, "list", "secrets", namespace=NS)
    assert not can(base, WEBHOOK, "get", "secrets", name=tls, namespace="team-a-dev")
    assert not can(base, DISPATCHER, "get", "secrets", name=tls, namespace=NS)
    redis_auth = "fairgate-redis-auth"  # created by the webhook's init container
    assert can(base, WEBHOOK, "get", "secrets", name=redis_auth, namespace=NS)
    assert can(base, WEBHOOK, "patch", "secrets", name=redis_auth, namespace=NS)
    assert not can(base, DISPATCHER, "get", "secrets", name=redis_auth, namespace=NS)
    console_tls = "fairgate-console-tls"  # created by the console's TLS sidecar
    assert can(base, CONSOLE, "patch", "secrets", name=console_tls, namespace=NS)
    for other in (tls, redis_auth):
        assert not can(base, CONSOLE, "get", "secrets", name=other, namespace=NS)
    assert not can(base, CONSOLE, "list", "secrets", namespace=NS)
    assert not can(base, WEBHOOK, "get", "secrets", name=console_tls, namespace=NS)


def test_configmaps_read_only_in_fairgate_system(base: list[Obj]) -> None:
    for subject in (WEBHOOK, DISPATCHER):
        assert can(base, subject, "watch", "configmaps", namespace=NS)
        assert not can(base, subject, "get", "configmaps", name="x", namespace="team-a-dev")
        assert not can(base, subject, "update", "configmaps", name="quota-team-a", namespace=NS)


def test_tenant_admin_reaches_only_its_quota(tenant_admin: list[Obj]) -> None:
    for subject in (TEAM_A_ADMINS, ALICE):
        for verb in ("get", "update", "patch"):
            assert can(tenant_admin, subject, verb, "configmaps", name="quota-team-a", namespace=NS)
        for name in ("quota-team-b", "fairgate-platform"):
            assert not can(tenant_admin, subject, "update", "configmaps", name=name, namespace=NS)
        assert not can(
            tenant_admin, subject, "update", "configmaps", name="quota-team-a", namespace="team-a"
        )
        for verb in ("create", "list"):
            assert not can(tenant_admin, subject, verb, "configmaps", namespace=NS)
    role = find(tenant_admin, "ClusterRole", "fairgate-quota-editor-team-a")
    assert [r["resourceNames"] for r in role["rules"]] == [["quota-team-a"]]
    binding = find(tenant_admin, "RoleBinding", "fairgate-quota-editor-team-a")
    assert binding["metadata"]["namespace"] == NS
    assert not of_kind(tenant_admin, "ClusterRoleBinding")


def test_tenant_admin_binding_matches_platform_admins(
    base: list[Obj], tenant_admin: list[Obj]
) -> None:
    """RBAC and the webhook's own check name the same people for team-a."""
    platform = parse_platform(find(base, "ConfigMap", "fairgate-platform")["data"]["platform.yaml"])
    admins = platform.tenants["team-a"].admins
    binding = find(tenant_admin, "RoleBinding", "fairgate-quota-editor-team-a")
    groups = {s["name"] for s in binding["subjects"] if s["kind"] == "Group"}
    users = {s["name"] for s in binding["subjects"] if s["kind"] == "User"}
    assert (groups, users) == (set(admins.groups), set(admins.users))

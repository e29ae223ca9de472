"""The webhook configurations: what is sent, where, and how failure is scoped."""

from __future__ import annotations

import pytest
from manifest_objects import Obj, find, selects
from matchcases import (
    MUTATE_PODS,
    VALIDATE_CLAIMS,
    VALIDATE_CONFIGMAPS,
    VALIDATE_PODS,
    VALIDATE_TEMPLATES,
)

POD_HOOKS = (MUTATE_PODS, VALIDATE_PODS)
CLAIM_HOOKS = (VALIDATE_CLAIMS, VALIDATE_TEMPLATES)


def namespace_labels(name: str, **extra: str) -> dict[str, str]:
    """A namespace's labels, with the one the API server always sets."""
    return {"kubernetes.io/metadata.name": name, **extra}


def test_selector_helper_rejects_what_it_should() -> None:
    sel = {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["a"]}]}
    assert selects(sel, {"k": "b"}) and not selects(sel, {"k": "a"})


@pytest.mark.parametrize("hook", POD_HOOKS)
def test_pod_webhooks_skip_system_namespaces(webhooks: dict[str, Obj], hook: str) -> None:
    selector = webhooks[hook]["namespaceSelector"]
    for ns in ("kube-system", "fairgate-system"):
        # Even a system namespace labelled as a tenant is never sent.
        assert not selects(selector, namespace_labels(ns, **{"fairgate.io/tenant": "team-a"}))
    for ns in ("team-a-dev", "default", "kube-public"):
        assert selects(selector, namespace_labels(ns))
    # Namespaces without the tenant label are still sent: the webhook denies
    # GPU pods there with a message naming the label to set.
    assert selects(selector, namespace_labels("untenanted"))


@pytest.mark.parametrize("hook", CLAIM_HOOKS)
def test_claim_webhooks_only_in_tenant_namespaces(webhooks: dict[str, Obj], hook: str) -> None:
    """Outside a tenant namespace fairgate allows every claim: none is sent there, so an
    outage refuses none there."""
    selector = webhooks[hook]["namespaceSelector"]
    tenant = {"fairgate.io/tenant": "team-a"}
    assert selects(selector, namespace_labels("team-a-dev", **tenant))
    for ns in ("kube-system", "fairgate-system"):
        assert not selects(selector, namespace_labels(ns, **tenant))
    for ns in ("default", "untenanted"):
        assert not selects(selector, namespace_labels(ns))


def test_configmap_webhook_only_in_fairgate_system(webhooks: dict[str, Obj]) -> None:
    selector = webhooks[VALIDATE_CONFIGMAPS]["namespaceSelector"]
    assert selects(selector, namespace_labels("fairgate-system"))
    for ns in ("team-a-dev", "kube-system", "default"):
        assert not selects(selector, namespace_labels(ns))


@pytest.mark.parametrize("hook", [MUTATE_PODS, VALIDATE_PODS, VALIDATE_CONFIGMAPS, *CLAIM_HOOKS])
def test_common_settings(webhooks: dict[str, Obj], hook: str) -> None:
    h = webhooks[hook]
    assert h["admissionReviewVersions"] == ["v1"]
    assert h["sideEffects"] == "NoneOnDryRun"
    assert 1 <= h["timeoutSeconds"] <= 5
    assert h["failurePolicy"] == "Fail"
    # The scope of Fail rests on these two: never send without them.
    assert h["matchConditions"]
    assert h["namespaceSelector"]
    service = h["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["port"]) == (
        "fairgate-webhook",
        "fairgate-system",
        443,
    )
    # Injected at runtime by `fairgate serve`; absent so re-applying keeps it.
    assert "caBundle" not in h["clientConfig"]
    assert "url" not in h["clientConfig"]


def test_paths_and_kinds(webhooks: dict[str, Obj]) -> None:
    assert webhooks[MUTATE_PODS]["kind"] == "MutatingWebhookConfiguration"
    assert webhooks[MUTATE_PODS]["clientConfig"]["service"]["path"] == "/mutate"
    for hook in (VALIDATE_PODS, VALIDATE_CONFIGMAPS, *CLAIM_HOOKS):
        assert webhooks[hook]["kind"] == "ValidatingWebhookConfiguration"
        assert webhooks[hook]["clientConfig"]["service"]["path"] == "/validate"


def test_mutating_webhook_reinvoked_if_needed(webhooks: dict[str, Obj]) -> None:
    assert webhooks[MUTATE_PODS]["reinvocationPolicy"] == "IfNeeded"


def _rule(webhooks: dict[str, Obj], hook: str) -> Obj:
    rules = webhooks[hook]["rules"]
    assert len(rules) == 1
    rule: Obj = rules[0]
    return rule


def test_rules(webhooks: dict[str, Obj]) -> None:
    core_v1 = {"apiGroups": [""], "apiVersions": ["v1"], "scope": "Namespaced"}
    expected = {
        MUTATE_PODS: (["CREATE"], ["pods"]),
        VALIDATE_PODS: (["CREATE", "UPDATE"], ["pods"]),
        VALIDATE_CONFIGMAPS: (["CREATE", "UPDATE", "DELETE"], ["configmaps"]),
    }
    for hook, (operations, resources) in expected.items():
        rule = _rule(webhooks, hook)
        assert rule == {**core_v1, "operations": operations, "resources": resources}, hook
    resource_v1 = {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                   "scope": "Namespaced", "operations": ["CREATE"]}
    assert _rule(webhooks, VALIDATE_CLAIMS) == {**resource_v1, "resources": ["resourceclaims"]}
    assert _rule(webhooks, VALIDATE_TEMPLATES) == {**resource_v1,
                                                   "resources": ["resourceclaimtemplates"]}


def test_configurations_are_named_for_the_ca_bundle_rbac(base: list[Obj]) -> None:
    """`fairgate serve` may patch exactly these two objects (see test_rbac)."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        find(base, kind, "fairgate")

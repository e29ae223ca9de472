"""The ValidatingAdmissionPolicy `fairgate-stamps` refuses exactly what it should.

Each case is one pod UPDATE (user, subresource, old and new pod) and the expected
verdict. The policy from the built base is evaluated by the API server's own code
(kubetool: the strict compile of a new policy, then the validator its admission plugin
builds) and by cel-python; both must agree with the table, and so must the validating
webhook's own rule (admission.validation.validate_update) wherever the webhook is asked:
the policy mirrors it, for every pod and subresource, without the webhook.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import pytest
from manifest_objects import Obj, find, of_kind
from matchcases import container, pod

from admission.validation import FAIRGATE_USERS, WEBHOOK_USER, validate_update
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    DISPATCHER_USER,
    FAIRGATE_PREFIX,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    FairgateConfig,
)
from tenants.placement import MIG_PROFILE_LABEL, NODE_POOL_ANNOTATION
from tenants.schema import parse_platform

POLICY = "fairgate-stamps"
ALICE = "alice@example.com"
NODE = "system:node:gpu-a100-0"
ADMIN = "kubernetes-admin"
GPU = {"nvidia.com/gpu": "1"}
STAMPS = {TENANT_LABEL: "team-a", CLASS_LABEL: "training"}
TICKETS = {TICKET_ANNOTATION: "t-1", DEMAND_ANNOTATION: "gpu=1"}


def stamped(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gates: list[str] | None = None,
    phase: str | None = None,
    deleting: bool = False,
    finalizers: list[str] | None = None,
) -> Obj:
    """A GPU pod as fairgate stamped it, with the given changes of metadata."""
    obj = pod(
        [container(limits=GPU)],
        labels=STAMPS | (labels or {}),
        annotations=TICKETS | (annotations or {}),
        gates=gates,
        phase=phase,
        deleting=deleting,
    )
    if finalizers is not None:
        obj["metadata"]["finalizers"] = finalizers
    return obj


@dataclass(frozen=True)
class Update:
    """One pod UPDATE and the verdict: None (allowed) or a fragment of the refusal."""

    id: str
    old: Obj
    new: Obj
    refused: str | None
    user: str = ALICE
    groups: tuple[str, ...] = ("team-a-devs",)
    subresource: str = ""
    words: tuple[str, ...] = field(default=())


def _drop(mapping: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in mapping.items() if k != key}


def _without(obj: Obj, where: str, key: str) -> Obj:
    obj["metadata"][where] = _drop(obj["metadata"][where], key)
    return obj


UPDATES = [
    Update(
        "change-mig-profile-label",
        stamped(labels={MIG_PROFILE_LABEL: "1g.5gb"}),
        stamped(labels={MIG_PROFILE_LABEL: "3g.20gb"}),
        f"label {MIG_PROFILE_LABEL} may not be added, changed or removed by {ALICE}",
    ),
    Update(
        "remove-node-pool-annotation",
        stamped(annotations={NODE_POOL_ANNOTATION: "a100"}),
        _without(stamped(annotations={NODE_POOL_ANNOTATION: "a100"}), "annotations",
                 NODE_POOL_ANNOTATION),
        f"annotation {NODE_POOL_ANNOTATION} may not",
    ),
    Update(
        "relabel-finished-pods-tenant",
        stamped(phase="Succeeded"),
        stamped(phase="Succeeded", labels={TENANT_LABEL: "team-b"}),
        f"label {TENANT_LABEL} may not be added, changed or removed by {ALICE}",
        words=("create a new pod",),
    ),
    Update(
        "copy-ticket-onto-finished-pod",
        stamped(phase="Failed"),
        stamped(phase="Failed", annotations={TICKET_ANNOTATION: "t-2"}),
        f"annotation {TICKET_ANNOTATION} may not be added, changed or removed by {ALICE}",
    ),
    Update(
        "remove-tenant-label",
        stamped(),
        _without(stamped(), "labels", TENANT_LABEL),
        f"label {TENANT_LABEL} may not",
    ),
    Update(
        "add-tenant-label-to-unlabelled-pod",
        pod([container()]),
        pod([container()], labels={TENANT_LABEL: "team-a"}),
        f"label {TENANT_LABEL} may not",
    ),
    Update(
        "add-borrowed-annotation-to-unannotated-pod",
        pod([container(limits=GPU)], labels=STAMPS),
        pod([container(limits=GPU)], labels=STAMPS, annotations={BORROWED_ANNOTATION: "true"}),
        f"annotation {BORROWED_ANNOTATION} may not",
    ),
    Update(
        "change-demand",
        stamped(),
        stamped(annotations={DEMAND_ANNOTATION: "gpu=0"}),
        f"annotation {DEMAND_ANNOTATION} may not",
    ),
    Update(
        "remove-borrowed",
        stamped(annotations={BORROWED_ANNOTATION: "true"}),
        stamped(),
        f"annotation {BORROWED_ANNOTATION} may not",
    ),
    Update(
        "change-pod-group-size",
        stamped(annotations={POD_GROUP_SIZE_ANNOTATION: "2"}),
        stamped(annotations={POD_GROUP_SIZE_ANNOTATION: "1"}),
        f"annotation {POD_GROUP_SIZE_ANNOTATION} may not",
    ),
    Update(
        "change-two-labels-names-both",
        stamped(),
        stamped(labels={TENANT_LABEL: "team-b", CLASS_LABEL: "inference"}),
        "may not be added, changed or removed",
        words=("labels ", CLASS_LABEL, TENANT_LABEL),  # in either order
    ),
    Update(
        "strip-the-gate",
        stamped(gates=[QUEUE_GATE]),
        stamped(),
        f"only fairgate's dispatcher may remove the scheduling gate {QUEUE_GATE}, not {ALICE}",
        words=("fairgate why",),
    ),
    Update(
        "strip-the-gate-keeping-another",
        stamped(gates=["example.com/hold", QUEUE_GATE]),
        stamped(gates=["example.com/hold"]),
        "only fairgate's dispatcher may remove",
    ),
    Update(
        "webhook-may-not-strip-the-gate",
        stamped(gates=[QUEUE_GATE]),
        stamped(),
        "only fairgate's dispatcher may remove",
        user=WEBHOOK_USER,
        groups=("system:serviceaccounts", "system:serviceaccounts:fairgate-system"),
    ),
    Update(
        "cluster-admin-relabels",
        stamped(),
        stamped(labels={TENANT_LABEL: "team-b"}),
        f"label {TENANT_LABEL} may not be added, changed or removed by {ADMIN}",
        user=ADMIN,
        groups=("system:masters",),
    ),
    Update(
        "node-rewrites-ticket-through-status",
        stamped(),
        stamped(annotations={TICKET_ANNOTATION: "t-2"}),
        f"annotation {TICKET_ANNOTATION} may not",
        user=NODE,
        groups=("system:nodes",),
        subresource="status",
    ),
    Update(
        "lookalike-service-account-is-not-fairgate",
        stamped(),
        stamped(labels={TENANT_LABEL: "team-b"}),
        f"label {TENANT_LABEL} may not",
        user="system:serviceaccount:team-a-dev:fairgate-dispatcher",
    ),
    Update(
        "remove-own-gate-keeping-fairgates",
        stamped(gates=["example.com/hold", QUEUE_GATE]),
        stamped(gates=[QUEUE_GATE]),
        None,
    ),
    Update(
        "drop-finalizer-of-terminating-pod",
        stamped(deleting=True, finalizers=["example.com/hold"]),
        stamped(deleting=True, finalizers=[]),
        None,
    ),
    Update(
        "other-labels-stay-the-users",
        stamped(phase="Succeeded"),
        stamped(phase="Succeeded", labels={"example.com/note": "x", "fairgate.io.example/x": "1"}),
        None,
    ),
    Update(
        "same-values-are-no-change",
        stamped(),
        stamped(labels=dict(STAMPS), annotations=dict(TICKETS)),
        None,
    ),
    Update("bare-pod", pod([container()]), pod([container()], labels={"app": "x"}), None),
    Update(
        "dispatcher-lifts-the-gate",
        stamped(gates=[QUEUE_GATE]),
        stamped(),
        None,
        user=DISPATCHER_USER,
    ),
    Update(
        "dispatcher-changes-fairgate-metadata",
        stamped(),
        stamped(annotations={BORROWED_ANNOTATION: "true"}, labels={TENANT_LABEL: "team-b"}),
        None,
        user=DISPATCHER_USER,
    ),
    Update(
        "webhook-changes-fairgate-metadata",
        stamped(),
        _without(stamped(), "annotations", DEMAND_ANNOTATION),
        None,
        user=WEBHOOK_USER,
    ),
    Update(
        "node-status-update-without-stamp-change",
        stamped(),
        stamped(phase="Running"),
        None,
        user=NODE,
        groups=("system:nodes",),
        subresource="status",
    ),
]


@pytest.fixture(scope="module")
def policy(base: list[Obj]) -> Obj:
    """The built ValidatingAdmissionPolicy."""
    return find(base, "ValidatingAdmissionPolicy", POLICY)


def test_policy_is_bound_to_deny_everywhere(base: list[Obj], policy: Obj) -> None:
    bindings = of_kind(base, "ValidatingAdmissionPolicyBinding")
    assert [b["spec"] for b in bindings] == [{"policyName": POLICY, "validationActions": ["Deny"]}]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert "paramKind" not in spec and "matchConditions" not in spec
    constraints = spec["matchConstraints"]
    assert "namespaceSelector" not in constraints and "objectSelector" not in constraints
    assert constraints["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods", "pods/*"],
            "scope": "Namespaced",
        }
    ]


def test_policy_names_fairgates_identities_and_markers(policy: Obj) -> None:
    """The policy spells out what tenants.models and admission.validation define."""
    text = json.dumps(policy["spec"])
    for user in FAIRGATE_USERS:
        assert f"'{user}'" in text, user
    assert f"'{DISPATCHER_USER}'" in text
    assert f"'{FAIRGATE_PREFIX}'" in text
    assert f"'{QUEUE_GATE}'" in text


# -- the API server's code -----------------------------------------------------------------


@pytest.fixture(scope="module")
def kubernetes_verdicts(policy: Obj, kubetool: Path) -> dict[str, list[Obj]]:
    """Each case's decisions from the API server's validating-policy code, by case id."""
    cases = [
        {
            "operation": "UPDATE",
            "subResource": u.subresource,
            "user": u.user,
            "groups": list(u.groups),
            "object": u.new,
            "oldObject": u.old,
        }
        for u in UPDATES
    ]
    out = _kubetool_policy(kubetool, policy, cases)
    assert out["compileErrors"] == [], out["compileErrors"]
    return dict(zip([u.id for u in UPDATES], out["results"], strict=True))


def _kubetool_policy(kubetool: Path, policy: Obj, cases: list[Obj]) -> Obj:
    proc = subprocess.run(
        [str(kubetool), "policy"],
        input=json.dumps({"policy": policy, "cases": cases}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: Obj = json.loads(proc.stdout)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("update", UPDATES, ids=[u.id for u in UPDATES])
def test_kubernetes_policy(kubernetes_verdicts: dict[str, list[Obj]], update: Update) -> None:
    decisions = kubernetes_verdicts[update.id]
    assert [d for d in decisions if d["evaluation"] == "error"] == []
    denials = [d for d in decisions if d["action"] == "deny"]
    if update.refused is None:
        assert denials == [], denials
        return
    assert len(denials) == 1, denials
    assert denials[0]["reason"] == "Forbidden"
    message = denials[0]["message"]
    for fragment in (update.refused, *update.words):
        assert fragment in message, (fragment, message)


@pytest.mark.slow
def test_kubetool_reports_compile_errors(policy: Obj, kubetool: Path) -> None:
    """The check above can fail: an expression that does not compile is reported."""
    broken = json.loads(json.dumps(policy))
    broken["spec"]["validations"][0]["expression"] = "variables.noSuchVariable == 1"
    out = _kubetool_policy(kubetool, broken, [])
    assert any("validation 0" in e for e in out["compileErrors"]), out


# -- cel-python and the webhook --------------------------------------------------------------

_ENV = celpy.Environment()


def celpy_allows(spec: Obj, update: Update) -> bool:
    """Whether every validation holds for ``update``, per cel-python (messages are left to
    the API server's code: cel-python lacks Kubernetes' string library)."""
    request = {
        "operation": "UPDATE",
        "subResource": update.subresource,
        "userInfo": {"username": update.user, "groups": list(update.groups)},
    }
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(update.new),
        "oldObject": celpy.json_to_cel(update.old),
        "request": celpy.json_to_cel(request),
    }
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        program = _ENV.program(_ENV.compile(variable["expression"]))
        variables[celpy.celtypes.StringType(variable["name"])] = program.evaluate(activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    results = []
    for validation in spec["validations"]:
        value = _ENV.program(_ENV.compile(validation["expression"])).evaluate(activation)
        assert isinstance(value, celpy.celtypes.BoolType), (update.id, value)
        results.append(bool(value))
    return all(results)


@pytest.mark.parametrize("update", UPDATES, ids=[u.id for u in UPDATES])
def test_cel_python(policy: Obj, update: Update) -> None:
    assert celpy_allows(policy["spec"], update) is (update.refused is None)


_CONFIG = FairgateConfig(  # validate_update's verdicts do not depend on the config
    platform=parse_platform("tenants: {team-a: {weight: 1, ceiling: {gpuEquivalents: 1}}}"),
    quotas={},
    namespaces={},
)


MAIN_RESOURCE = [u for u in UPDATES if not u.subresource]


@pytest.mark.parametrize("update", MAIN_RESOURCE, ids=[u.id for u in MAIN_RESOURCE])
def test_webhook_rule_agrees(update: Update) -> None:
    """On the main resource the webhook's rule gives the same verdict (it is not asked about
    subresources, nor about finished or terminating pods: that is the policy's job)."""
    verdict = validate_update(update.old, update.new, update.user, list(update.groups), _CONFIG)
    assert verdict.allowed is (update.refused is None), verdict.reason

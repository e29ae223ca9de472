"""Objects and expected outcomes for the webhooks' CEL matchConditions.

Each case is one admission request (operation, object, oldObject) sent to one
webhook entry, with whether the API server must call the webhook. The same
cases run through cel-python and through the API server's own CEL code
(kubetool), so both engines are held to one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
)

MUTATE_PODS = "pods.mutate.fairgate.io"
VALIDATE_PODS = "pods.validate.fairgate.io"
VALIDATE_CONFIGMAPS = "configmaps.validate.fairgate.io"
VALIDATE_CLAIMS = "resourceclaims.validate.fairgate.io"
VALIDATE_TEMPLATES = "resourceclaimtemplates.validate.fairgate.io"
RESOURCES = {VALIDATE_CONFIGMAPS: "configmaps", VALIDATE_CLAIMS: "resourceclaims",
             VALIDATE_TEMPLATES: "resourceclaimtemplates"}

Obj = dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One admission request for one webhook, and whether it must be sent."""

    id: str
    hook: str
    operation: str
    object: Obj | None
    old_object: Obj | None
    sent: bool

    @property
    def resource(self) -> str:
        """The API resource of the request."""
        return RESOURCES.get(self.hook, "pods")


def container(name: str = "main", **resources: dict[str, str]) -> Obj:
    """A container; ``resources`` keywords become its ``resources`` field."""
    c: Obj = {"name": name, "image": "registry.example.com/app:1"}
    if resources:
        c["resources"] = dict(resources)
    return c


def pod(
    containers: list[Obj] | None = None,
    init_containers: list[Obj] | None = None,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gates: list[str] | None = None,
    deleting: bool = False,
    phase: str | None = None,
    claims: list[Obj] | None = None,
) -> Obj:
    """A pod, with only the fields given (absent fields stay absent)."""
    meta: Obj = {"name": "p", "namespace": "team-a-dev"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: Obj = {"containers": containers if containers is not None else [container()]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if claims is not None:
        spec["resourceClaims"] = claims
    obj: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def configmap(name: str | None = None, generate_name: str | None = None,
              labels: dict[str, str] | None = None) -> Obj:
    """A ConfigMap in fairgate-system, named or to be named from ``generate_name``."""
    meta: Obj = {"namespace": "fairgate-system"}
    if name is not None:
        meta["name"] = name
    if generate_name is not None:
        meta["generateName"] = generate_name
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


def request(device_class: str | None = None, *alternatives: str | None,
            **exactly: Any) -> Obj:
    """A device request: ``exactly`` one of ``device_class``, or ``firstAvailable`` of
    the ``alternatives`` (None: a field left out)."""
    if alternatives:
        return {"name": "r", "firstAvailable": [
            {"name": f"a{i}"} | ({} if c is None else {"deviceClassName": c})
            for i, c in enumerate(alternatives)]}
    exact: Obj = dict(exactly)
    if device_class is not None:
        exact["deviceClassName"] = device_class
    return {"name": "r", "exactly": exact}


def claim_spec(*requests: Obj) -> Obj:
    """A claim spec with these requests (none: no ``devices`` at all)."""
    return {"devices": {"requests": list(requests)}} if requests else {}


def resource_claim(spec: Obj | None) -> Obj:
    """A ResourceClaim with ``spec`` (None: no spec field)."""
    claim: Obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": "c", "namespace": "team-a-dev"}}
    if spec is not None:
        claim["spec"] = spec
    return claim


def resource_claim_template(spec: Obj | None) -> Obj:
    """A ResourceClaimTemplate whose claim spec is ``spec`` (None: ``spec: {}``)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "team-a-dev"},
            "spec": {} if spec is None else {"spec": spec}}


GPU1 = {"nvidia.com/gpu": "1"}
MIG = {"nvidia.com/mig-1g.5gb": "2"}
CPU = {"cpu": "500m", "memory": "1Gi"}
DRA_GPU = {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"}
TEMPLATE_CLAIM = {"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}
SHARED_CLAIM = {"name": "gpus", "resourceClaimName": "team-gpus"}

# A large pod: 60 app containers and 20 init containers, each naming 8
# resources. Evaluating it must stay within the API server's CEL cost budget
# (an exhausted budget is an error, and an error refuses the request).
WIDE = {f"example.com/r{i}": "1" for i in range(6)} | CPU


def wide_pod(gpu_in_last_init: bool) -> Obj:
    """A pod with many containers and resources; optionally a GPU at the very end."""
    inits = [container(f"i{i}", limits=WIDE, requests=WIDE) for i in range(20)]
    if gpu_in_last_init:
        inits[-1] = container("i19", limits=WIDE | GPU1, requests=WIDE | GPU1)
    return pod([container(f"c{i}", limits=WIDE, requests=WIDE) for i in range(60)], inits)


# Pods, each with whether it asks for an nvidia.com/ resource anywhere.
GPU_PODS: list[tuple[str, Obj, bool]] = [
    ("gpu-limits-in-container", pod([container(limits=GPU1)]), True),
    ("mig-limits-in-container", pod([container(limits=MIG)]), True),
    ("gpu-in-second-container", pod([container(limits=CPU), container("b", limits=GPU1)]), True),
    ("gpu-limits-and-requests", pod([container(limits=GPU1, requests=GPU1)]), True),
    ("gpu-only-in-requests", pod([container(requests=GPU1)]), True),
    ("gpu-in-init-container", pod([container()], [container("init", limits=GPU1)]), True),
    (
        "gpu-in-restartable-sidecar",
        pod([container()], [{**container("sidecar", limits=MIG), "restartPolicy": "Always"}]),
        True,
    ),
    ("gpu-in-init-requests-only", pod([container()], [container("init", requests=MIG)]), True),
    ("empty-resources", pod([{**container(), "resources": {}}]), False),
    ("empty-limits-and-requests", pod([container(limits={}, requests={})]), False),
    ("no-resources-field", pod([container()]), False),
    ("no-init-containers-field-cpu-only", pod([container(limits=CPU, requests=CPU)]), False),
    ("empty-init-containers", pod([container(limits=CPU)], []), False),
    ("cpu-init-and-sidecar", pod([container()], [container("init", limits=CPU)]), False),
    ("other-vendor-gpu", pod([container(limits={"amd.com/gpu": "1"})]), False),
    ("nvidia-not-a-prefix", pod([container(limits={"example.com/nvidia.com-gpu": "1"})]), False),
    ("no-containers-field", {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}, False),
    (
        "null-containers",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {},
            "spec": {"containers": None, "initContainers": None},
        },
        False,
    ),
    ("no-spec", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, False),
    ("dra-implicit-extended-resource", pod([container(limits=DRA_GPU)]), True),
    ("dra-extended-resource-in-init-requests",
     pod([container()], [container("init", requests=DRA_GPU)]), True),
    ("dra-claim-from-template", pod([container()], claims=[TEMPLATE_CLAIM]), True),
    ("dra-shared-claim", pod([container(limits=CPU)], claims=[SHARED_CLAIM]), True),
    ("empty-resource-claims", pod([container(limits=CPU)], claims=[]), False),
    (
        "null-resource-claims",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {},
         "spec": {"containers": [container()], "resourceClaims": None}},
        False,
    ),
    ("wide-pod-gpu-last", wide_pod(True), True),
    ("wide-pod-no-gpu", wide_pod(False), False),
]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for name, obj, gpu in GPU_PODS:
        cases.append(Case(f"mutate-create-{name}", MUTATE_PODS, "CREATE", obj, None, gpu))
        cases.append(Case(f"validate-create-{name}", VALIDATE_PODS, "CREATE", obj, None, gpu))

    cpu = pod([container(limits=CPU)])
    gpu = pod([container(limits=GPU1)])

    def v(id: str, op: str, new: Obj, old: Obj | None, sent: bool) -> None:
        cases.append(Case(id, VALIDATE_PODS, op, new, old, sent))

    # CREATE of a pod without GPUs: only markers that fairgate alone sets make
    # it fairgate's business (a forged marker is refused, not waved through).
    v("create-cpu-user-class-label", "CREATE", pod(labels={CLASS_LABEL: "inference"}), None, False)
    v(
        "create-cpu-user-pod-group",
        "CREATE",
        pod(labels={POD_GROUP_LABEL: "g"}, annotations={POD_GROUP_SIZE_ANNOTATION: "4"}),
        None,
        False,
    )
    v("create-cpu-other-labels", "CREATE", pod(labels={"app": "web"}, annotations={}), None, False)
    v("create-cpu-forged-tenant-label", "CREATE", pod(labels={TENANT_LABEL: "team-b"}), None, True)
    for ann in (TICKET_ANNOTATION, DEMAND_ANNOTATION, BORROWED_ANNOTATION):
        v(f"create-cpu-forged-{ann}", "CREATE", pod(annotations={ann: "x"}), None, True)
    v("create-cpu-forged-gate", "CREATE", pod(gates=[QUEUE_GATE]), None, True)
    v("create-cpu-other-gate", "CREATE", pod(gates=["example.com/hold"]), None, False)

    # UPDATE: what the validating webhook must see.
    dra = pod([container()], claims=[TEMPLATE_CLAIM])
    v("update-dra-gate-removed", "UPDATE", dra,
      pod([container()], gates=[QUEUE_GATE], claims=[TEMPLATE_CLAIM]), True)
    v("update-dra-old-object-only", "UPDATE", pod([container()]), dra, True)
    v(
        "update-gpu-gate-removed",
        "UPDATE",
        gpu,
        pod([container(limits=GPU1)], gates=[QUEUE_GATE]),
        True,
    )
    v(
        "update-gpu-label-change",
        "UPDATE",
        pod([container(limits=GPU1)], labels={"x": "1"}),
        gpu,
        True,
    )
    v(
        "update-running-gpu",
        "UPDATE",
        pod([container(limits=GPU1)], phase="Running"),
        pod([container(limits=GPU1)], phase="Running"),
        True,
    )
    v(
        "update-cpu-gate-removed",
        "UPDATE",
        cpu,
        pod([container(limits=CPU)], gates=[QUEUE_GATE]),
        True,
    )
    v("update-cpu-tenant-label-added", "UPDATE", pod(labels={TENANT_LABEL: "team-a"}), pod(), True)
    v(
        "update-cpu-tenant-label-removed",
        "UPDATE",
        pod(labels={}),
        pod(labels={TENANT_LABEL: "team-a"}),
        True,
    )
    v(
        "update-cpu-demand-annotation-added",
        "UPDATE",
        pod(annotations={DEMAND_ANNOTATION: "gpu=8"}),
        pod(),
        True,
    )
    v("update-cpu-plain", "UPDATE", pod(labels={"app": "b"}), pod(labels={"app": "a"}), False)
    v(
        "update-cpu-class-label",
        "UPDATE",
        pod(labels={CLASS_LABEL: "training"}),
        pod(labels={CLASS_LABEL: "inference"}),
        False,
    )
    v(
        "update-cpu-other-gate-removed",
        "UPDATE",
        cpu,
        pod([container(limits=CPU)], gates=["example.com/hold"]),
        False,
    )
    # Terminating or finished pods hold no place in the queue and cannot be
    # scheduled: their finalizers must not wait for fairgate.
    v(
        "update-gpu-terminating",
        "UPDATE",
        pod([container(limits=GPU1)], deleting=True),
        pod([container(limits=GPU1)], deleting=True),
        False,
    )
    v(
        "update-gpu-succeeded",
        "UPDATE",
        pod([container(limits=GPU1)], phase="Succeeded"),
        pod([container(limits=GPU1)], phase="Succeeded"),
        False,
    )
    v(
        "update-gpu-failed",
        "UPDATE",
        pod([container(limits=GPU1)], phase="Failed"),
        pod([container(limits=GPU1)], phase="Failed"),
        False,
    )

    def c(id: str, op: str, new: Obj | None, old: Obj | None, sent: bool) -> None:
        cases.append(Case(id, VALIDATE_CONFIGMAPS, op, new, old, sent))

    for op in ("CREATE", "UPDATE"):
        for name, sent in (
            ("fairgate-platform", True),
            ("quota-team-a", True),
            ("quota-team-b", True),
            ("fairgate-platform-backup", False),
            ("kube-root-ca.crt", False),
            ("my-quota-notes", False),
        ):
            old = configmap(name) if op == "UPDATE" else None
            c(f"cm-{op.lower()}-{name}", op, configmap(name), old, sent)
    c("cm-create-generate-name-quota", "CREATE", configmap(generate_name="quota-"), None, True)
    c("cm-create-generate-name-other", "CREATE", configmap(generate_name="cache-"), None, False)
    quota_label = {"fairgate.io/quota": "team-a"}
    c("cm-create-generate-name-labelled", "CREATE",
      configmap(generate_name="cache-", labels=quota_label), None, True)
    c("cm-create-other-labelled", "CREATE", configmap("notes", labels=quota_label), None, True)
    c("cm-update-other-labelled", "UPDATE", configmap("notes", labels=quota_label),
      configmap("notes"), True)
    c("cm-update-other-unlabelled", "UPDATE", configmap("notes", labels={"app": "x"}),
      configmap("notes", labels=quota_label), False)
    c("cm-delete-quota-team-b", "DELETE", None, configmap("quota-team-b"), True)
    c("cm-delete-platform", "DELETE", None, configmap("fairgate-platform"), True)
    c("cm-delete-other", "DELETE", None, configmap("other"), False)

    # ResourceClaims and ResourceClaimTemplates: sent only when a request asks for a
    # GPU DeviceClass, in exactly or in any firstAvailable alternative.
    gpu, mig, nic = "gpu.nvidia.com", "mig.nvidia.com", "nic.example.com"
    specs: list[tuple[str, Obj | None, bool]] = [
        ("exact-gpu", claim_spec(request(gpu, count=8)), True),
        ("exact-gpu-all", claim_spec(request(gpu, allocationMode="All")), True),
        ("exact-mig", claim_spec(request(mig)), True),
        ("gpu-after-nic", claim_spec(request(nic), request(gpu)), True),
        ("first-available-gpu-last", claim_spec(request(None, nic, gpu)), True),
        ("first-available-mig", claim_spec(request(None, mig)), True),
        ("exact-nic", claim_spec(request(nic, count=8)), False),
        ("first-available-nic", claim_spec(request(None, nic, None)), False),
        ("class-like-gpu", claim_spec(request("gpu.nvidia.com.example")), False),
        ("no-class", claim_spec(request(None)), False),
        ("no-devices", claim_spec(), False),
        ("no-requests", {"devices": {}}, False),
        ("no-spec", None, False),
    ]
    for name, spec, sent in specs:
        cases.append(Case(f"claim-{name}", VALIDATE_CLAIMS, "CREATE",
                          resource_claim(spec), None, sent))
        cases.append(Case(f"template-{name}", VALIDATE_TEMPLATES, "CREATE",
                          resource_claim_template(spec), None, sent))
    return cases


CASES = _cases()

"""GPUs asked for through Dynamic Resource Allocation are counted, queued and placed like
`nvidia.com/gpu`, on the real control plane (its scheduler allocates the claims, the
resourceclaim-controller makes the claims of templates).

The cluster: `gpu-a100-0` with 4 GPUs in allocatable, `gpu-dra-0` whose 8 GPUs exist
only in a ResourceSlice (the NVIDIA DRA driver's way), and a `mixed` MIG node whose
1g.5gb devices are published the same way. team-b may hold 4 GPUs (nominal 4, no
borrowing). Every route a tenant user has to a GPU is tried: the implicit extended
resource `deviceclass.resource.kubernetes.io/gpu.nvidia.com`, a ResourceClaimTemplate,
a ResourceClaim shared by several pods (charged once), and DRA mixed with
`nvidia.com/gpu`; in each, team-b's running GPUs never pass 4 and fairgate charges what
runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import refusal
from harness.dra import (
    GPU_CLASS,
    IMPLICIT_GPU,
    MIG_CLASS,
    ClaimsApi,
    claim_manifest,
    dra_gpu_node,
    exactly,
    gpu_slice,
    mig_slice,
    publish,
    template_manifest,
)
from harness.fairgate import pods_api, tenant_namespace
from harness.kubelet import GpuNode, whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRA_NODE = dra_gpu_node("gpu-dra-0", gpus=8)
MIG_NODE = GpuNode("gpu-dra-mig", "NVIDIA-A100-SXM4-40GB", "mixed", {}, 1, 40960)
NODES = (whole_gpu_node("gpu-a100-0", 4), DRA_NODE, MIG_NODE)
TENANT = "team-b"
NS = tenant_namespace(TENANT)
SETTLE = 8.0  # seconds a queued pod is watched to stay gated


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("dra"), NODES) as cluster:
        publish(cluster.cp, [gpu_slice(DRA_NODE.name, 8),
                             mig_slice(MIG_NODE.name, {"1g.5gb": 7})])
        yield cluster


@pytest.fixture
def claims(env: PrivateCluster) -> Iterator[ClaimsApi]:
    """team-b's claims API; pods, claims and templates are gone and fairgate idle after."""
    api = ClaimsApi(env.cp, TENANT, NS)
    yield api
    for tenant in ("team-a", "team-b"):
        env.admin.delete_collection_namespaced_pod(tenant_namespace(tenant),
                                                   grace_period_seconds=0)
        wait_for(partial(no_pods, env.admin, tenant_namespace(tenant)), 60, "pods to go")
    api.delete_all()
    env.fairgate.wait_idle(60)


def _create(env: PrivateCluster, pod: dict[str, Any], tenant: str = TENANT) -> None:
    pods_api(env.cp, tenant).create_namespaced_pod(tenant_namespace(tenant), pod)


def _with_claims(pod: dict[str, Any], **named: dict[str, str]) -> dict[str, Any]:
    """`pod` with `spec.resourceClaims` (name -> {"resourceClaimTemplateName": ...} or
    {"resourceClaimName": ...}), each claimed by its one container."""
    pod["spec"]["resourceClaims"] = [{"name": name, **source} for name, source in named.items()]
    pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [
        {"name": name} for name in named
    ]
    return pod


def _runs(env: PrivateCluster, name: str) -> str:
    node: str = wait_for(lambda: running_node(env.admin, NS, name), 60, f"{name} to run")
    return node


def _used(env: PrivateCluster) -> float:
    used: float = env.fairgate.tenant_state(TENANT).get("used", 0.0)
    return used


def _stays_gated(env: PrivateCluster, name: str) -> None:
    wait_for(lambda: is_gated(env.admin.read_namespaced_pod(name, NS)), 30,
             f"{name} to be gated")
    with pytest.raises(AssertionError):
        wait_for(lambda: not is_gated(env.admin.read_namespaced_pod(name, NS)), SETTLE,
                 f"{name} to stay gated")


def _running_gpus(env: PrivateCluster) -> int:
    """GPUs team-b's running pods hold, from what the scheduler allocated: each running
    pod's claims (its own, its template's, the scheduler's for an extended resource)."""
    total = 0
    names: set[str] = set()  # a shared claim's GPUs once
    for pod in env.admin.list_namespaced_pod(NS).items:
        if pod.status.phase != "Running":
            continue
        names |= {s.resource_claim_name for s in pod.status.resource_claim_statuses or []}
        names |= {c.resource_claim_name for c in pod.spec.resource_claims or []
                  if c.resource_claim_name}
        extended = pod.status.extended_resource_claim_status
        if extended is not None:
            names.add(extended.resource_claim_name)
        for container in pod.spec.containers:
            limits = (container.resources.limits or {}) if container.resources else {}
            total += int(limits.get("nvidia.com/gpu", 0))
    resource = client.ResourceV1Api(env.cp.admin)
    for name in names:
        claim = resource.read_namespaced_resource_claim(name, NS)
        total += len(claim.status.allocation.devices.results)
    return total


def test_a_node_whose_gpus_exist_only_in_slices_has_capacity(env: PrivateCluster) -> None:
    wait_for(lambda: env.class_capacity().get("gpu") == 12 or None, 30,
             "the DRA node's 8 GPUs to add to the 4 in allocatable")
    assert env.class_capacity().get("mig-1g.5gb") == 7


def test_the_implicit_extended_resource_is_counted_and_queued(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    _create(env, pod_manifest("implicit-3", {IMPLICIT_GPU: 3}))
    assert _runs(env, "implicit-3") == DRA_NODE.name
    wait_for(lambda: _used(env) == 3.0 or None, 30, "team-b to be charged 3 GPUs")
    _create(env, pod_manifest("implicit-2", {IMPLICIT_GPU: 2}))
    _stays_gated(env, "implicit-2")
    assert _used(env) == 3.0 and _running_gpus(env) == 3
    env.admin.delete_namespaced_pod("implicit-3", NS, grace_period_seconds=0)
    assert _runs(env, "implicit-2") == DRA_NODE.name
    wait_for(lambda: _used(env) == 2.0 or None, 30, "team-b to be charged 2 GPUs")


def test_a_template_is_counted_per_pod(env: PrivateCluster, claims: ClaimsApi) -> None:
    claims.create(template_manifest("two-gpus", exactly(GPU_CLASS, 2)))
    for name in ("tpl-0", "tpl-1", "tpl-2"):
        _create(env, _with_claims(pod_manifest(name),
                                  gpus={"resourceClaimTemplateName": "two-gpus"}))
    for name in ("tpl-0", "tpl-1"):
        assert _runs(env, name) == DRA_NODE.name
    _stays_gated(env, "tpl-2")
    assert _used(env) == 4.0 and _running_gpus(env) == 4


def test_a_shared_claim_is_charged_once_and_while_any_pod_holds_it(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    """Two pods naming one 3-GPU claim both run on team-b's 4 GPUs, charged 3 (the
    claim's devices, once); a third pod asking 2 GPUs of its own waits; the claim stays
    charged when the pod first charged for it ends while the other still holds it, and
    its charge goes with the last of them."""
    claims.create(claim_manifest("shared-three", exactly(GPU_CLASS, 3)))
    for name in ("shared-0", "shared-1"):
        _create(env, _with_claims(pod_manifest(name),
                                  gpus={"resourceClaimName": "shared-three"}))
    for name in ("shared-0", "shared-1"):
        assert _runs(env, name) == DRA_NODE.name
    wait_for(lambda: _used(env) == 3.0 or None, 30, "team-b to be charged 3 GPUs")
    assert _running_gpus(env) == 3
    # `fairgate why` explains the pod riding on the claim by the claim and its payer
    told = {name: env.why(NS, name) for name in ("shared-0", "shared-1")}
    riders = {name: t for name, t in told.items() if t.get("riding")}
    assert len(riders) == 1, told
    [(rider, said)] = riders.items()
    payer = ({"shared-0", "shared-1"} - {rider}).pop()
    assert said["verdict"] == "running" and said["charged"] == "", said
    assert [ride["claim"] for ride in said["riding"].values()] == ["shared-three"], said
    assert [ride["payer"] for ride in said["riding"].values()] == [f"{NS}/{payer}"], said
    _create(env, pod_manifest("own-2", {IMPLICIT_GPU: 2}))
    _stays_gated(env, "own-2")
    assert _used(env) == 3.0

    env.admin.delete_namespaced_pod("shared-0", NS, grace_period_seconds=0)
    wait_for(partial(_gone, env, "shared-0"), 60, "shared-0 to go")
    for _ in range(10):  # the claim's devices are still held: still charged, own-2 waits
        # (while the charge moves to shared-1 it may be counted twice for a moment: an
        # over-charge, never an under-charge)
        assert _used(env) >= 3.0
        assert is_gated(env.admin.read_namespaced_pod("own-2", NS))
    wait_for(lambda: _used(env) == 3.0 or None, 30, "the claim to be charged once again")
    env.admin.delete_namespaced_pod("shared-1", NS, grace_period_seconds=0)
    assert _runs(env, "own-2") == DRA_NODE.name
    wait_for(lambda: _used(env) == 2.0 or None, 30, "team-b to be charged own-2's 2 GPUs")


def _gone(env: PrivateCluster, name: str) -> bool:
    return name not in {p.metadata.name for p in env.admin.list_namespaced_pod(NS).items}


def test_dra_and_nvidia_gpu_pods_share_one_quota(env: PrivateCluster, claims: ClaimsApi) -> None:
    claims.create(template_manifest("one-gpu", exactly(GPU_CLASS, 1)))
    _create(env, pod_manifest("plugin-2", {"nvidia.com/gpu": 2}))
    _create(env, pod_manifest("implicit-2", {IMPLICIT_GPU: 2}))
    assert _runs(env, "plugin-2") == "gpu-a100-0"
    assert _runs(env, "implicit-2") == DRA_NODE.name
    _create(env, _with_claims(pod_manifest("tpl-1"), gpus={"resourceClaimTemplateName": "one-gpu"}))
    _stays_gated(env, "tpl-1")
    assert _used(env) == 4.0


def test_mig_devices_through_dra_count_against_the_mig_quota(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    """team-a's nominal has 7 x 1g.5gb: a template of 4 runs once, the second waits."""
    selector = "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
    api = ClaimsApi(env.cp, "team-a", tenant_namespace("team-a"))
    api.create(template_manifest("four-mig", exactly(MIG_CLASS, 4, selector=selector)))
    try:
        for name in ("mig-0", "mig-1"):
            _create(env, _with_claims(pod_manifest(name),
                                      mig={"resourceClaimTemplateName": "four-mig"}), "team-a")
        ns = tenant_namespace("team-a")
        wait_for(lambda: running_node(env.admin, ns, "mig-0"), 60, "mig-0 to run")
        wait_for(lambda: is_gated(env.admin.read_namespaced_pod("mig-1", ns)), 30,
                 "mig-1 to be gated")
        assert env.class_capacity().get("mig-1g.5gb") == 7
    finally:
        api.delete_all()


def test_what_cannot_be_bounded_is_refused_saying_why(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    claims.create(template_manifest("all-gpus", exactly(GPU_CLASS, 0, mode="All")))
    status, message = refusal(lambda: _create(env, _with_claims(
        pod_manifest("all"), gpus={"resourceClaimTemplateName": "all-gpus"})))
    assert status == 403 and "allocationMode" in message and "All" in message, message
    status, message = refusal(lambda: _create(env, _with_claims(
        pod_manifest("missing"), gpus={"resourceClaimTemplateName": "no-such-template"})))
    assert status == 403 and "no-such-template" in message, message

"""A tenant user swaps the DRA objects its pods name, on the real control plane: the
devices the scheduler allocates to its pods never pass its quota, and what fairgate
charges never falls below what they hold.

Each test is a route a tenant user has with only a tenant's rights (pods, claims and
templates in its own namespace): replace a claim while its pod waits, replace a template
after its pods run, replace a template a few milliseconds after the pod that names it is
created (the webhook's watch may still hold the old one), and hide a MIG profile test in a
CEL comment. team-b may hold 4 GPUs (nominal 4, no borrowing); the DRA node has 8.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import refusal
from harness.dra import (
    GPU_CLASS,
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
from harness.fairgate import pods_api, tenant_namespace, tenant_user
from harness.kubelet import GpuNode, whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRA_NODE = dra_gpu_node("gpu-dra-0", gpus=8)
MIG_NODE = GpuNode("gpu-dra-mig", "NVIDIA-A100-SXM4-40GB", "mixed", {}, 1, 40960)
NODES = (whole_gpu_node("gpu-a100-0", 4), DRA_NODE, MIG_NODE)
TENANT = "team-b"
NS = tenant_namespace(TENANT)
QUOTA = 4
SETTLE = 8.0  # seconds a pod is watched to stay gated


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("dra-swaps"), NODES) as cluster:
        publish(cluster.cp, [gpu_slice(DRA_NODE.name, 8),
                             mig_slice(MIG_NODE.name, {"1g.5gb": 7, "7g.40gb": 7})])
        yield cluster


@pytest.fixture
def claims(env: PrivateCluster) -> Iterator[ClaimsApi]:
    """team-b's claims API; its pods, claims and templates are gone after."""
    api = ClaimsApi(env.cp, TENANT, NS)
    yield api
    env.admin.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    wait_for(partial(no_pods, env.admin, NS), 60, "pods to go")
    api.delete_all()
    env.fairgate.wait_idle(60)


def _create(env: PrivateCluster, pod: dict[str, Any], tenant: str = TENANT) -> None:
    pods_api(env.cp, tenant).create_namespaced_pod(tenant_namespace(tenant), pod)


def _claiming(name: str, **source: str) -> dict[str, Any]:
    """A pod whose one container uses one claim `gpus` from ``source``."""
    pod = pod_manifest(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", **source}]
    pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": "gpus"}]
    return pod


def _delete_as_tenant(env: PrivateCluster, plural: str, name: str) -> None:
    user, groups = tenant_user(TENANT)
    user_api = client.CustomObjectsApi(env.cp.client_for(user, groups))
    user_api.delete_namespaced_custom_object("resource.k8s.io", "v1", NS, plural, name)
    admin = client.CustomObjectsApi(env.cp.admin)

    def gone() -> bool:
        try:
            admin.get_namespaced_custom_object("resource.k8s.io", "v1", NS, plural, name)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, 30, f"{plural}/{name} to be gone")


def _recreate(claims: ClaimsApi, manifest: dict[str, Any]) -> bool:
    """Create ``manifest`` again as the tenant user; False if fairgate refused it."""
    try:
        claims.create(manifest)
    except ApiException as error:
        assert error.status in (400, 403), error
        return False
    return True


def _allocated(env: PrivateCluster) -> int:
    """Devices the scheduler allocated to team-b's claims (what its pods hold or are
    about to), plus the nvidia.com/gpu of its running pods."""
    resource = client.ResourceV1Api(env.cp.admin)
    total = sum(len(c.status.allocation.devices.results)
                for c in resource.list_namespaced_resource_claim(NS).items
                if c.status and c.status.allocation)
    for pod in env.admin.list_namespaced_pod(NS).items:
        if pod.status.phase == "Running":
            for container in pod.spec.containers:
                limits = (container.resources.limits or {}) if container.resources else {}
                total += int(limits.get("nvidia.com/gpu", 0))
    return total


def _charged(env: PrivateCluster) -> float:
    used: float = env.fairgate.tenant_state(TENANT).get("used", 0.0)
    return used


def _holds_within_quota(env: PrivateCluster, seconds: float,
                        also: Callable[[], None] = lambda: None) -> None:
    """For ``seconds``: allocated <= quota, and allocated <= charged once charged."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        allocated = _allocated(env)
        assert allocated <= QUOTA, f"team-b holds {allocated} devices, quota {QUOTA}"
        also()
        time.sleep(0.5)


def _events(env: PrivateCluster, pod: str) -> list[str]:
    found = env.admin.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod}")
    return [f"{e.reason}: {e.message}" for e in found.items]


def test_a_claim_replaced_while_its_pod_waits_is_not_released_on_the_old_price(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    _create(env, pod_manifest("holder", {"nvidia.com/gpu": QUOTA}))
    wait_for(lambda: running_node(env.admin, NS, "holder"), 60, "holder to run")
    claims.create(claim_manifest("c", exactly(GPU_CLASS, 1)))
    _create(env, _claiming("swap", resourceClaimName="c"))
    wait_for(lambda: is_gated(env.admin.read_namespaced_pod("swap", NS)), 30, "swap gated")
    _delete_as_tenant(env, "resourceclaims", "c")
    replaced = _recreate(claims, claim_manifest("c", exactly(GPU_CLASS, 8)))
    env.admin.delete_namespaced_pod("holder", NS, grace_period_seconds=0)
    _holds_within_quota(env, SETTLE)
    assert is_gated(env.admin.read_namespaced_pod("swap", NS))
    if replaced:  # the dispatcher priced the claim it would get, and said why not
        assert any(e.startswith("ClaimsReplaced") for e in _events(env, "swap")), \
            _events(env, "swap")


def test_a_template_replaced_after_its_pods_run_keeps_them_charged(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    claims.create(template_manifest("t", exactly(GPU_CLASS, 2)))
    for name in ("run-0", "run-1"):
        _create(env, _claiming(name, resourceClaimTemplateName="t"))
    for name in ("run-0", "run-1"):
        wait_for(lambda n=name: running_node(env.admin, NS, n), 60, f"{name} to run")
    wait_for(lambda: _charged(env) == 4.0 or None, 30, "team-b to be charged 4")
    _delete_as_tenant(env, "resourceclaimtemplates", "t")
    _recreate(claims, template_manifest("t", exactly("nic.example.com", 1)))
    _create(env, pod_manifest("next", {"nvidia.com/gpu": 2}))
    _holds_within_quota(env, SETTLE, also=lambda: _charged_at_least(env, 4.0))
    assert is_gated(env.admin.read_namespaced_pod("next", NS))


def _charged_at_least(env: PrivateCluster, gpus: float) -> None:
    charged = _charged(env)
    assert charged >= gpus, f"team-b charged {charged}, holds {gpus}"


def test_a_template_replaced_just_after_its_pod_is_created_is_caught(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    """The webhook may have priced the old template from its watch; the claim the
    resourceclaim controller makes comes from the new one. Tried several times, with
    10-40 ms between the pod and the swap."""
    rng = random.Random(7)
    for attempt in range(6):
        name = f"race-{attempt}"
        claims.create(template_manifest("race", exactly(GPU_CLASS, 1)))
        _create(env, _claiming(name, resourceClaimTemplateName="race"))
        time.sleep(rng.uniform(0.010, 0.040))
        _delete_as_tenant(env, "resourceclaimtemplates", "race")
        _recreate(claims, template_manifest("race", exactly(GPU_CLASS, 8)))
        _holds_within_quota(env, 4.0)
        env.admin.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        wait_for(partial(no_pods, env.admin, NS), 60, "pods to go")
        claims.delete_all()  # the template as it is now (the re-creation may be refused)


def test_a_mig_profile_hidden_in_a_cel_comment_is_priced_as_cel_reads_it(
    env: PrivateCluster,
) -> None:
    """Seven MIG devices whose profile test sits in a comment: CEL can give seven
    7g.40gb devices (7 GPU-eq), so that is the price, not seven 1g.5gb (1 GPU-eq)."""
    ns = tenant_namespace("team-a")
    team_a = ClaimsApi(env.cp, "team-a", ns)
    selector = ("device.attributes['gpu.nvidia.com'].type == 'mig' // && "
                "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'\n")
    team_a.create(template_manifest("sneaky", exactly(MIG_CLASS, 7, selector=selector)))
    try:
        # priced as CEL reads it: seven 7g.40gb, more than team-a may ever hold of it
        status, message = refusal(lambda: _create(
            env, _claiming("sneaky", resourceClaimTemplateName="sneaky"), "team-a"))
        assert status == 403 and "mig-7g.40gb=7" in message, message
    finally:
        env.admin.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        wait_for(partial(no_pods, env.admin, ns), 60, "pods to go")
        team_a.delete_all()

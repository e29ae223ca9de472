"""A ResourceClaim or ResourceClaimTemplate deleted and made again under the same name,
asking for more GPUs, while a pod that names it is admitted: refused by fairgate's
validating webhook, on the real control plane, as a tenant user.

team-b may hold 4 GPUs. A 4-GPU pod fills its quota, so the next pod, which names a
1-GPU claim or template, waits behind the gate (a gated pod gets no allocation, so its
claim can still be deleted). The user then deletes that claim or template and creates it
again with `count: 8` or `allocationMode: All`: refused, with a message saying which pod
was admitted for what. With the webhook down, only a claim for a GPU class is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import refusal
from harness.dra import (
    GPU_CLASS,
    ClaimsApi,
    claim_manifest,
    dra_gpu_node,
    exactly,
    gpu_slice,
    publish,
    template_manifest,
)
from harness.fairgate import pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRA_NODE = dra_gpu_node("gpu-dra-0", gpus=8)
NODES = (whole_gpu_node("gpu-a100-0", 4), DRA_NODE)
TENANT = "team-b"
NS = tenant_namespace(TENANT)
NIC_CLASS = "nic.example.com"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("claim-swap"), NODES) as cluster:
        publish(cluster.cp, [gpu_slice(DRA_NODE.name, 8)])
        yield cluster


@pytest.fixture
def claims(env: PrivateCluster) -> Iterator[ClaimsApi]:
    """team-b's claims API; pods, claims and templates are gone and fairgate idle after."""
    api = ClaimsApi(env.cp, TENANT, NS)
    yield api
    if env.fairgate.webhook is None:
        env.fairgate.start_webhook()
    env.admin.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    wait_for(partial(no_pods, env.admin, NS), 60, "pods to go")
    api.delete_all()
    env.fairgate.wait_idle(60)


def _create(env: PrivateCluster, pod: dict[str, Any]) -> None:
    pods_api(env.cp, TENANT).create_namespaced_pod(NS, pod)


def _gated_behind_a_full_quota(env: PrivateCluster, name: str, source: dict[str, str]) -> None:
    """Fill team-b's 4 GPUs, then create pod `name` naming `source` (a claim or a
    template, for the container): it is admitted, and waits behind the gate."""
    _create(env, pod_manifest("filler", {"nvidia.com/gpu": 4}))
    wait_for(lambda: running_node(env.admin, NS, "filler"), 60, "filler to run")
    pod = pod_manifest(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", **source}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    _create(env, pod)
    wait_for(lambda: is_gated(env.admin.read_namespaced_pod(name, NS)), 30,
             f"{name} to be gated")


def _refused_saying_why(create: Callable[[], Any], pod: str, asks: str) -> None:
    status, message = refusal(create)
    assert status == 403, message
    for part in (f"{NS}/{pod} (queued) for gpu=1", asks, "Delete those pods first",
                 "new name"):
        assert part in message, (part, message)


def test_a_claim_made_again_with_more_gpus_under_an_admitted_pod_is_refused(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    claims.create(claim_manifest("c", exactly(GPU_CLASS, 1)))
    _gated_behind_a_full_quota(env, "p", {"resourceClaimName": "c"})
    claims.delete("ResourceClaim", "c")
    _refused_saying_why(lambda: claims.create(claim_manifest("c", exactly(GPU_CLASS, 8))),
                        "p", "asks for gpu=8")
    _refused_saying_why(
        lambda: claims.create(claim_manifest("c", exactly(GPU_CLASS, 0, mode="All"))),
        "p", "cannot be priced")
    claims.create(claim_manifest("c", exactly(GPU_CLASS, 1)))  # the same price is fine
    assert is_gated(env.admin.read_namespaced_pod("p", NS))


def test_a_template_made_again_with_more_gpus_under_an_admitted_pod_is_refused(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    claims.create(template_manifest("tpl", exactly(GPU_CLASS, 1)))
    _gated_behind_a_full_quota(env, "q", {"resourceClaimTemplateName": "tpl"})
    claims.delete("ResourceClaimTemplate", "tpl")
    _refused_saying_why(
        lambda: claims.create(template_manifest("tpl", exactly(GPU_CLASS, 8))),
        "q", "asks for gpu=8")
    claims.create(template_manifest("other", exactly(GPU_CLASS, 8)))  # a new name is fine


def test_with_the_webhook_down_only_gpu_claims_are_refused(
    env: PrivateCluster, claims: ClaimsApi,
) -> None:
    env.fairgate.stop_webhook()
    claims.create(claim_manifest("nic", exactly(NIC_CLASS, 2)))
    claims.create(template_manifest("nic", exactly(NIC_CLASS, 2)))
    for gpus in (claim_manifest("gpus", exactly(GPU_CLASS, 1)),
                 template_manifest("gpus", exactly(GPU_CLASS, 1))):
        status, message = refusal(partial(claims.create, gpus))
        assert status == 500, message
        assert "failed calling webhook" in message and "validate.fairgate.io" in message

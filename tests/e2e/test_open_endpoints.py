"""The webhook's open endpoints in a cluster: what anyone who reaches `fairgate serve`'s
port can learn without credentials. fairgate installed from manifests/, the config read
from the cluster's ConfigMaps by `fairgate serve` as its own ServiceAccount.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx
import pytest
from harness.controlplane import ControlPlane
from harness.fairgate import QUOTA_YAML, SYSTEM_NAMESPACE, FairgateStack
from harness.waiting import wait_for
from kubernetes import client

pytestmark = pytest.mark.e2e

VALIDATING = ("ValidatingWebhookConfiguration",)


def _set_quota(fairgate: FairgateStack, core: Any, text: str) -> None:
    """Write quota-team-b as the cluster admin with fairgate's validating webhook out of
    the way: as an edit made while the webhook was not installed."""
    fairgate.uninstall_webhooks(VALIDATING)
    try:
        core.patch_namespaced_config_map("quota-team-b", SYSTEM_NAMESPACE,
                                         {"data": {"quota.yaml": text}})
    finally:
        fairgate.install_webhooks(VALIDATING)


def test_readyz_of_the_webhook_with_a_broken_quota_tells_nothing_about_the_tenant(
        controlplane: ControlPlane, fairgate: FairgateStack) -> None:
    """quota-team-b asks 777 GPUs, over its tenant's ceiling: the webhook keeps the last
    good quota and says why in its log; an anonymous /readyz still answers 200 and names
    no tenant, number, ConfigMap or error text."""
    core: Any = client.CoreV1Api(controlplane.admin)
    assert fairgate.webhook is not None
    log = fairgate.webhook.log_path
    _set_quota(fairgate, core, "nominal: {gpu: 777}\ndefaultClass: training\n")
    try:
        wait_for(lambda: "777" in log.read_text(errors="replace"), 60,
                 "the webhook to log the refused quota")
        context = ssl.create_default_context(cafile=str(fairgate.cert_dir / "ca.crt"))
        context.check_hostname = False  # the certificate names the Service
        with httpx.Client(verify=context, timeout=10) as anonymous:
            ready = anonymous.get(f"https://127.0.0.1:{fairgate.port}/readyz")
    finally:
        _set_quota(fairgate, core, QUOTA_YAML["team-b"])
    assert ready.status_code == 200, ready.text  # the last good quota still serves
    assert ready.json()["ready"] is True
    for secret in ("team-b", "777", "quota", "ceiling", "nominal", "gpu", "yaml",
                   SYSTEM_NAMESPACE):
        assert secret not in ready.text.lower(), (secret, ready.text)

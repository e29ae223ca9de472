"""Pricing in platform.yaml, price edits as the webhook audits them, and what the
dispatcher reads from pods and nodes for billing (GPU product, scheduler preemption)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from admission.demand import pod_demand
from audit.chain import AuditRecord, format_time
from audit.usage import start_detail
from cost.billing import bill
from fairshare.cluster.kube import node_gpus, pod_from_manifest
from tenants.configmaps import field_diff
from tenants.models import PriorityClasses
from tenants.schema import ConfigError, load_yaml_mapping, parse_platform
from tests.fairshare.cluster.test_kube import STAMPED

T0 = datetime(2026, 5, 1, tzinfo=UTC)


def test_prices_by_product_with_a_default_or_one_number() -> None:
    mapped = parse_platform("pricing: {currency: EUR, gpuHour: {default: 2.5, "
                            "NVIDIA-H100-80GB-HBM3: 4.25}}").pricing
    assert mapped is not None and mapped.currency == "EUR"
    assert mapped.price("NVIDIA-H100-80GB-HBM3") == 4.25 and mapped.price("other") == 2.5
    assert mapped.price(None) == 2.5
    single = parse_platform("pricing: {gpuHour: 3}").pricing
    assert single is not None and single.price("anything") == 3.0 and single.currency == "USD"
    no_default = parse_platform("pricing: {gpuHour: {NVIDIA-H100-80GB-HBM3: 4}}").pricing
    assert no_default is not None and no_default.price("other") == 0.0
    assert parse_platform("tenants: {}").pricing is None


@pytest.mark.parametrize(("text", "message"), [
    ("pricing: {gpuHour: {default: -1}}", "price of 'default' is -1"),
    ("pricing: {gpuHour: cheap}", "price of 'default' is 'cheap': write a number"),
    ("pricing: {gpuHour: {A100: true}}", "price of 'A100' is True"),
    ("pricing: {currency: usd}", "pricing.currency"),
    ("pricing: {gpuHours: 2}", "pricing.gpuHours: unknown key"),
])
def test_bad_prices_are_refused_with_the_field_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="pricing") as error:
        parse_platform(text)
    assert message in str(error.value)


def test_a_price_edit_audited_by_the_webhook_applies_from_its_time_on() -> None:
    before = load_yaml_mapping("pricing: {gpuHour: {default: 2.0}}", "old")
    after = load_yaml_mapping("pricing: {gpuHour: {default: 2.0, NVIDIA-A100-SXM4-80GB: 5}}",
                              "new")
    diff = field_diff(before, after)
    assert diff == {"pricing.gpuHour.NVIDIA-A100-SXM4-80GB": {"before": None, "after": 5}}
    fields: dict[str, Any] = {"uid": "p", "tenant": "t", "pod_class": "training",
                              "demand": "gpu=1"}
    records = [
        AuditRecord("start", time=format_time(T0), diff=start_detail(
            "training", "n", "NVIDIA-A100-SXM4-80GB"), **fields),
        AuditRecord("quota-change", time=format_time(T0 + timedelta(hours=1)),
                    name="fairgate-platform", namespace="fairgate-system", diff=diff),
        # the same path edited in a tenant's quota ConfigMap is not a price
        AuditRecord("quota-change", time=format_time(T0 + timedelta(hours=1)),
                    name="quota-t", namespace="fairgate-system",
                    diff={"pricing.gpuHour.default": {"before": None, "after": 100}}),
        AuditRecord("release", time=format_time(T0 + timedelta(hours=3)), **fields),
    ]
    current = parse_platform("pricing: {gpuHour: {default: 2.0, "
                             "NVIDIA-A100-SXM4-80GB: 5}}").pricing
    (row,) = bill(records, T0, T0 + timedelta(hours=4), current).rows
    # 1 h at the default 2.00 (the A100 price did not exist yet), then 2 h at 5.00
    assert row.cost == pytest.approx(2.0 + 2 * 5.0)


def test_the_dispatcher_reads_the_nodes_gpu_product_and_scheduler_preemption() -> None:
    node = {"metadata": {"name": "gpu-1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    assert node_gpus(node).product == "NVIDIA-A100-SXM4-80GB"
    assert node_gpus({"metadata": {"name": "cpu"}}).product is None

    pod = copy.deepcopy(STAMPED)
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
         "message": "default-scheduler: preempting to accommodate a higher priority pod"}]}
    read = pod_from_manifest(pod, PriorityClasses(), pod_demand)
    assert read is not None and read.preempted and read.preemptor is None
    for reason in ("EvictionByEvictionAPI", "DeletionByTaintManager"):
        pod["status"]["conditions"][0]["reason"] = reason
        other = pod_from_manifest(pod, PriorityClasses(), pod_demand)
        assert other is not None and not other.preempted

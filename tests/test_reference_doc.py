"""docs/reference.md keeps up with the code: every name fairgate reads or writes on a pod,
namespace or ConfigMap, every field of platform.yaml, quota.yaml and a simulation trace,
and every key of ``fairgate simulate --json`` is in it (a field added to a model and not
to the reference fails here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel

from fairshare.sim import trace as trace_models
from fairshare.sim.gangs import GangOutcome
from fairshare.sim.simulate import run_simulation
from fairshare.sim.trace import parse_trace
from tenants import models

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text of the ``## title`` section (up to the next ``## ``)."""
    start = REFERENCE.index(f"\n## {title}")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start:end if end >= 0 else len(REFERENCE)]


def _keys(model: type[BaseModel]) -> list[str]:
    """The YAML keys of ``model``: each field's alias, else its name."""
    return [field.alias or name for name, field in model.model_fields.items()]


def _mentioned(key: str, text: str) -> bool:
    """``key`` as a word of ``text`` (a YAML key, a backticked name)."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


NAMES = [
    "TENANT_LABEL", "CLASS_LABEL", "POD_GROUP_LABEL", "PREEMPTIBLE_LABEL",
    "POD_GROUP_SIZE_ANNOTATION",
    "TICKET_ANNOTATION", "DEMAND_ANNOTATION", "BORROWED_ANNOTATION", "QUEUE_GATE",
    "QUOTA_LABEL", "CONTROL_NAMESPACE", "PLATFORM_CONFIGMAP", "PLATFORM_KEY", "QUOTA_KEY",
]


@pytest.mark.parametrize("constant", NAMES)
def test_every_name_fairgate_uses_is_in_the_reference(constant: str) -> None:
    value = getattr(models, constant)
    assert f"`{value}" in _section("Names"), f"{constant} = {value!r}"


CONFIG_MODELS = {
    "Platform configuration (`platform.yaml`)": (
        models.PlatformConfig, models.TenantSpec, models.PricingSpec, models.FairShareSpec,
        models.ReclaimSpec, models.BudgetSpec, models.AutoscalingSpec, models.PriorityClasses,
        models.PriorityClassSpec, models.Principals),
    "Quota (`quota.yaml` of `quota-<tenant>`)": (models.QuotaSpec,),
    "Simulation trace": (trace_models.Trace, trace_models.TraceTenant, trace_models.Arrival,
                         trace_models.TraceAutoscaling),
}


@pytest.mark.parametrize("title", list(CONFIG_MODELS))
def test_every_field_of_a_format_is_in_its_section(title: str) -> None:
    text = _section(title)
    missing = [f"{model.__name__}.{key}" for model in CONFIG_MODELS[title]
               for key in _keys(model) if not _mentioned(key, text)]
    assert missing == []


def test_every_key_of_simulate_json_is_in_the_reference(redis_url: str) -> None:
    trace = parse_trace({
        "capacity": {"gpu": 2},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 1}}},
        "arrivals": [{"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
                      "duration": 10, "count": 3},
                     {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
                      "duration": 10, "group": "g", "groupSize": 2}],
        "horizon": 60,
    })
    report = run_simulation(trace, redis_url).to_json()
    text = _section("Simulation trace")
    keys = list(report) + list(report["tenants"]["team-a"]) + list(report["preemption"])
    keys += list(report["autoscaling"]) + list(report["autoscaling"]["wait_seconds"])
    keys += [key for waits in report["wait_seconds"].values() for key in waits]
    keys += [key for gang in report["gangs"] for key in gang] + list(get_args(GangOutcome))
    assert report["gangs"]  # the trace has a gang
    assert [key for key in keys if not _mentioned(key, text)] == []

"""resolve_class: label if allowed, else defaultClass, else the owner's kind."""

from __future__ import annotations

import dataclasses

import pytest
from admission_kit import CONFIG, gpu_pod

from admission.classes import ClassError, resolve_class
from admission.pods import PodView
from tenants.models import CLASS_LABEL, Tenant


def tenant(name: str, **changes: object) -> Tenant:
    found = CONFIG.tenant(name)
    assert found is not None
    return dataclasses.replace(found, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "owner", "changes", "expected", "overridden", "reason"),
    [
        ("inference", "Job", {}, "inference", False, "from label"),
        ("training", "ReplicaSet", {}, "training", False, "from label"),
        (None, "ReplicaSet", {}, "inference", False, "owner ReplicaSet"),
        (None, "StatefulSet", {}, "inference", False, "owner StatefulSet"),
        (None, "Deployment", {}, "inference", False, "owner Deployment"),
        (None, "LeaderWorkerSet", {}, "inference", False, "owner LeaderWorkerSet"),
        (None, "Job", {}, "training", False, "owner Job"),
        (None, "JobSet", {}, "training", False, "owner JobSet"),
        (None, "PyTorchJob", {}, "training", False, "owner PyTorchJob"),
        (None, "RayJob", {}, "training", False, "owner RayJob"),
        (None, "SomethingElse", {}, "training", False, "owner SomethingElse"),
        (None, None, {}, "training", False, "no owner"),
        (
            None,
            "ReplicaSet",
            {"default_class": "training"},
            "training",
            False,
            "defaultClass training",
        ),
        (
            "bogus",
            "ReplicaSet",
            {},
            "inference",
            True,
            "fairgate.io/class='bogus' is not inference or training; "
            "using inference (owner ReplicaSet)",
        ),
        (
            "inference",
            None,
            {"classes": ("training",), "default_class": "training"},
            "training",
            True,
            "class 'inference' not allowed for team-a; using defaultClass training",
        ),
        # defaultClass not allowed -> owner; owner's class not allowed -> the only allowed one
        (
            None,
            "ReplicaSet",
            {"classes": ("training",), "default_class": "inference"},
            "training",
            False,
            "only class allowed",
        ),
        ("Inference", "Job", {}, "training", True, "is not inference or training"),
    ],
)
def test_resolve_class(
    label: str | None,
    owner: str | None,
    changes: dict[str, object],
    expected: str,
    overridden: bool,
    reason: str,
) -> None:
    pod = gpu_pod(labels={CLASS_LABEL: label} if label else None, owner=owner)
    choice = resolve_class(PodView.parse(pod), tenant("team-a", **changes))
    assert choice.pod_class == expected
    assert choice.overridden is overridden
    assert reason in choice.reason


def test_controller_owner_wins_over_first_owner() -> None:
    pod = gpu_pod()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "1"},
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "s",
            "uid": "2",
            "controller": True,
        },
    ]
    assert resolve_class(PodView.parse(pod), tenant("team-a")).pod_class == "inference"


def test_tenant_without_classes_is_an_error() -> None:
    with pytest.raises(ClassError, match="allows no pod classes"):
        resolve_class(PodView.parse(gpu_pod()), tenant("team-a", classes=()))

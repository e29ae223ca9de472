"""Every manifest is valid Kubernetes, checked against the API's own schema."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from manifest_objects import MANIFESTS, TENANT_ADMIN, Obj

# The newest schema the library ships, and an older release still in wide use
# (the oldest with everything used here: matchConditions GA, preStop sleep).
SCHEMA_VERSIONS = [kubernetes_validate.latest_version(), "1.31.0"]
CLUSTER_SCOPED_POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _validate(objs: list[Obj], version: str) -> list[str]:
    problems = []
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = f"{obj['kind']} {obj['metadata'].get('name')}"
            problems.append(f"{where}: {exc.message} at {list(exc.path)}")
    return problems


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_base_validates_strictly(base: list[Obj], version: str) -> None:
    assert _validate(base, version) == []


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_tenant_admin_validates_strictly(tenant_admin: list[Obj], version: str) -> None:
    assert _validate(tenant_admin, version) == []


def test_strict_validation_catches_a_typo(base: list[Obj]) -> None:
    """The check above can fail: an unknown field is reported."""
    deployment = next(o for o in base if o["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert _validate([broken], SCHEMA_VERSIONS[0])


def _resource_files(directory: Path) -> set[str]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return set(kustomization["resources"])


def test_every_yaml_file_is_built() -> None:
    """No manifest escapes validation by being left out of a kustomization."""
    for directory in (MANIFESTS, TENANT_ADMIN):
        on_disk = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
        assert on_disk == _resource_files(directory), directory


def test_base_is_crd_free_and_in_its_namespace(base: list[Obj]) -> None:
    kinds = {o["kind"] for o in base}
    assert "CustomResourceDefinition" not in kinds
    namespaced = [o for o in base if "namespace" in o["metadata"]]
    assert namespaced
    assert {o["metadata"]["namespace"] for o in namespaced} == {"fairgate-system"}


def test_webhook_configurations_come_last(base: list[Obj]) -> None:
    """Applied in this order, nothing in the base is held up by its own webhooks."""
    kinds = [o["kind"] for o in base]
    assert kinds[-2:] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert kinds[0] == "Namespace"


@pytest.mark.e2e
def test_kubectl_kustomize_agrees(base: list[Obj], kubectl: Path) -> None:
    """`kubectl kustomize` (kubectl of the e2e control plane's release) prints the same
    objects as kubetool's kustomize."""
    out = subprocess.run(
        [str(kubectl), "kustomize", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    printed = [d for d in yaml.safe_load_all(out) if d]
    for obj in printed:
        # kustomize before kubernetes-sigs/kustomize#6056 (kubectl 1.36.3 ships kustomize
        # v5.8.1, api v0.21.1; kubetool builds with api v0.21.2) takes the cluster-scoped
        # policy kinds for namespaced and sets `namespace` on them; the API server clears a
        # namespace on cluster-scoped objects, so both apply alike.
        if obj["kind"] in CLUSTER_SCOPED_POLICY_KINDS:
            obj["metadata"].pop("namespace", None)
    assert printed == base


def test_policy_kinds_are_cluster_scoped_in_the_reference_build(base: list[Obj]) -> None:
    """kubetool's kustomize has the fix the comparison above allows for."""
    policies = [o for o in base if o["kind"] in CLUSTER_SCOPED_POLICY_KINDS]
    assert policies
    assert all("namespace" not in o["metadata"] for o in policies)

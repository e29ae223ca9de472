"""Fixtures for the manifest tests: kubetool, built once, and the built manifests; and
the e2e harness's `kubectl` (tests marked `e2e` make the run build it first) and `helm`
(built first when a selected test uses it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from manifest_objects import MANIFESTS, TENANT_ADMIN, Obj, build_kubetool, find, kustomize_build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from harness.fixtures import helm, kubectl
from harness.fixtures import pytest_collection_finish as build_controlplane_if_e2e

__all__ = ["helm", "kubectl"]

_kubetool: Path | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build kubetool before the first manifest test runs, and the control plane's
    binaries if an e2e test is selected, outside any test timeout."""
    global _kubetool
    here = Path(__file__).resolve().parent
    if any(here in Path(str(item.fspath)).resolve().parents for item in session.items):
        _kubetool = build_kubetool()
    build_controlplane_if_e2e(session)


@pytest.fixture(scope="session")
def kubetool() -> Path:
    """Path of the kubetool binary built at collection time."""
    if _kubetool is None:
        pytest.fail("kubetool was not built at collection time")
    return _kubetool


@pytest.fixture(scope="session")
def base(kubetool: Path) -> list[Obj]:
    """The kustomize base `manifests/`, built."""
    return kustomize_build(kubetool, MANIFESTS)


@pytest.fixture(scope="session")
def tenant_admin(kubetool: Path) -> list[Obj]:
    """The tenant-admin example `manifests/tenant-admin/`, built."""
    return kustomize_build(kubetool, TENANT_ADMIN)


@pytest.fixture(scope="session")
def webhooks(base: list[Obj]) -> dict[str, Obj]:
    """Every webhook entry of the two `fairgate` configurations, by name."""
    entries: dict[str, Obj] = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(base, kind, "fairgate")["webhooks"]:
            entries[hook["name"]] = {**hook, "kind": kind}
    return entries

"""Fixtures for e2e tests against a real control plane built from Go modules.

The binaries are built (or found up to date) once per run, before any test starts, if
any e2e test is selected: see tests/e2e/controlplane/build.sh. Then one session-wide
control plane (etcd, kube-apiserver, kube-scheduler) runs on loopback with fake GPU
nodes and a fake kubelet; tests that need fairgate get it installed and running from
the `fairgate` fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from harness.controlplane import ControlPlane, ControlPlaneError, build_controlplane
from harness.fairgate import FairgateStack
from harness.kubelet import FakeKubelet
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

E2E_DIR = Path(__file__).parent
_bin_dir: Path | None = None


def _is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.fspath)).parents


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the control plane before the first e2e test, outside any test timeout."""
    global _bin_dir
    if any(_is_e2e(item) for item in session.items):
        try:
            _bin_dir = build_controlplane()
        except ControlPlaneError as error:
            raise pytest.UsageError(str(error)) from error


@pytest.fixture(scope="session")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-scheduler, ready; logs under <tmp>/controlplane*/logs."""
    if _bin_dir is None:
        raise ControlPlaneError("control plane binaries were not built at collection time")
    cp = ControlPlane(_bin_dir, tmp_path_factory.mktemp("controlplane"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kubelet(controlplane: ControlPlane) -> Iterator[FakeKubelet]:
    """The default fake GPU nodes, registered and kept Ready by a running fake kubelet."""
    fake = FakeKubelet(controlplane)
    fake.register_nodes()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
    assert not fake.errors, f"fake kubelet errors: {fake.errors}"


@pytest.fixture(scope="module")
def fairgate(
    controlplane: ControlPlane, kubelet: FakeKubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FairgateStack]:
    """fairgate installed from manifests/, `fairgate serve` and `fairgate dispatch` running.

    It has its own redis-server (`fairgate.redis`). Module-scoped: after the module the webhook
    configurations are removed, so tests elsewhere see a cluster without fairgate. It
    installs into fixed namespaces, so only one module per session can use it.
    """
    stack = FairgateStack(controlplane, tmp_path_factory.mktemp("fairgate"))
    try:
        stack.install()
        stack.start_webhook()
        stack.start_dispatcher()
        yield stack
    finally:
        stack.stop()
        stack.uninstall_webhooks()


NamespaceFactory = Callable[..., str]


def _no_pods(core: Any, namespace: str) -> bool:
    return not core.list_namespaced_pod(namespace).items


@pytest.fixture
def make_namespace(controlplane: ControlPlane) -> Iterator[NamespaceFactory]:
    """Create namespaces (with their `default` ServiceAccount); clean their pods up after.

    There is no controller-manager, so this does what its controllers would: it creates
    the `default` ServiceAccount and, at teardown, deletes the pods before the namespace.
    """
    core: Any = client.CoreV1Api(controlplane.admin)
    created: list[str] = []

    def make(prefix: str = "e2e", labels: Mapping[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
        created.append(name)
        return name

    yield make
    for name in created:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        wait_for(partial(_no_pods, core, name), 30, f"pods of namespace {name} to be deleted")
        try:
            core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise

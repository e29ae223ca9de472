"""The e2e fixtures, shared by every directory of tests against the real control plane.

A conftest makes them available by importing them (tests/e2e/conftest.py and
tests/security/conftest.py do). The binaries are built (or found up to date) once per
run, before any test starts, if any selected test is marked `e2e`: see
tests/e2e/controlplane/build.sh. Then one session-wide control plane (etcd,
kube-apiserver, kube-scheduler) per conftest directory runs on loopback with fake GPU
nodes and a fake kubelet; tests that need fairgate get it installed and running from
the `fairgate` fixture. `kubectl` is the kubectl of the same release.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .api import MERGE_PATCH, create_namespace
from .controlplane import ControlPlane, ControlPlaneError, build_controlplane
from .fairgate import QUOTA_YAML, FairgateStack, tenant_namespace
from .helm import build_helm
from .kubelet import FakeKubelet
from .kueue import build_kueue
from .pods import no_pods
from .waiting import wait_for

_bin_dir: Path | None = None
_helm: Path | None = None
_kueue_home: Path | None = None


def _is_e2e(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the control plane before the first e2e test, and helm (Kueue) before the first
    test that uses the `helm` (`kueue_home`) fixture, outside any test timeout, showing the
    build scripts' progress (a cold build takes minutes) on the terminal."""
    global _bin_dir, _helm, _kueue_home
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    progress = reporter.write_line if reporter is not None else None
    if _bin_dir is None and any(_is_e2e(item) for item in session.items):
        try:
            _bin_dir = build_controlplane(progress)
        except ControlPlaneError as error:
            raise pytest.UsageError(str(error)) from error
    uses_helm = any("helm" in getattr(item, "fixturenames", ()) for item in session.items)
    if _helm is None and uses_helm:
        try:
            _helm = build_helm(progress)
        except ControlPlaneError as error:
            raise pytest.UsageError(str(error)) from error
    uses_kueue = any("kueue_home" in getattr(item, "fixturenames", ()) for item in session.items)
    if _kueue_home is None and uses_kueue:
        try:
            _kueue_home = build_kueue()
        except ControlPlaneError as error:
            raise pytest.UsageError(str(error)) from error


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary (tests/e2e/controlplane/build-helm.sh), built at collection time."""
    if _helm is None:
        raise ControlPlaneError("helm was not built at collection time")
    return _helm


@pytest.fixture(scope="session")
def kueue_home() -> Path:
    """The Kueue manager and its module's config (tests/e2e/controlplane/build_kueue.sh),
    built at collection time like the control plane."""
    if _kueue_home is None:
        raise ControlPlaneError("Kueue was not built at collection time")
    return _kueue_home


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """The kubectl of the control plane's Kubernetes release, built with it."""
    if _bin_dir is None:
        raise ControlPlaneError("control plane binaries were not built at collection time")
    return _bin_dir / "kubectl"


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
    installs into fixed namespaces by server-side apply: the next module to use it takes
    over what the last one left (with a Redis of its own, so nothing queued carries over).
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
        stack.uninstall_policies()


@pytest.fixture
def tenant_pods(controlplane: ControlPlane, fairgate: FairgateStack) -> Iterator[None]:
    """Start with no pods in the tenant namespaces and fairgate settled; clean up after.

    Finalizers a test left on its pods are dropped first (as their controller would; a
    pod its controller let go meanwhile is gone already).
    """
    admin: Any = client.CoreV1Api(controlplane.admin)

    def clean() -> None:
        for tenant in QUOTA_YAML:
            namespace = tenant_namespace(tenant)
            for pod in admin.list_namespaced_pod(namespace).items:
                if pod.metadata.finalizers:
                    try:
                        admin.patch_namespaced_pod(
                            pod.metadata.name,
                            namespace,
                            {"metadata": {"finalizers": None}},
                            _content_type=MERGE_PATCH,
                        )
                    except ApiException as exc:
                        if exc.status != 404:
                            raise
            admin.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            wait_for(partial(no_pods, admin, namespace), 30, f"pods of {namespace} to go")
        fairgate.wait_idle()

    clean()
    yield
    fairgate.check_alive()
    clean()


NamespaceFactory = Callable[..., str]


@pytest.fixture
def make_namespace(controlplane: ControlPlane) -> Iterator[NamespaceFactory]:
    """Create namespaces (returned once their `default` ServiceAccount exists); clean
    their pods up after (deleted at once, so their GPUs are free for the next test),
    then delete the namespaces."""
    core: Any = client.CoreV1Api(controlplane.admin)
    created: list[str] = []

    def make(prefix: str = "e2e", labels: Mapping[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        create_namespace(core, name, labels)
        created.append(name)
        return name

    yield make
    for name in created:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        wait_for(partial(no_pods, core, name), 30, f"pods of namespace {name} to be deleted")
        try:
            core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise

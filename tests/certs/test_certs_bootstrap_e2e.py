"""Cluster certificate bootstrap against a real kube-apiserver (no mocked client).

The control plane comes from the e2e harness (tests/e2e/harness, binaries built by
tests/e2e/controlplane/build.sh); this module starts its own for the certs tests.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from certs_https import HttpsServer
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store
from harness.controlplane import ControlPlane, build_controlplane
from harness.waiting import wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from certs import Bundle, load_bundle
from certs.bootstrap import (
    BootstrapError,
    WebhookTarget,
    ensure_certificates,
    maintain_certificates,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPLICAS = 4


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (+ scheduler) on loopback for this module."""
    plane = ControlPlane(build_controlplane(), tmp_path_factory.mktemp("certs-controlplane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def replica_client(plane: ControlPlane) -> client.ApiClient:
    """A separate API client, as each webhook replica would have its own."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(plane.admin_kubeconfig), persist_config=False
    )
    return api


def _webhook(name: str, namespace: str) -> dict[str, Any]:
    # Matches only a resource that does not exist, so it can never affect anything else.
    return {
        "name": name,
        "clientConfig": {"service": {"name": "fairgate-webhook", "namespace": namespace}},
        "rules": [
            {
                "apiGroups": ["fairgate.test"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["widgets"],
            }
        ],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    }


@dataclass
class Cluster:
    plane: ControlPlane
    target: WebhookTarget

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.plane.admin)

    @property
    def admission(self) -> Any:
        return client.AdmissionregistrationV1Api(self.plane.admin)

    def secret(self) -> Any:
        return self.core.read_namespaced_secret(self.target.secret_name, self.target.namespace)

    def secret_bundle(self) -> Bundle:
        data = self.secret().data
        files = {k: base64.b64decode(v) for k, v in data.items()}
        return Bundle.from_files(files, source="secret")

    def ca_bundles(self) -> list[bytes]:
        """caBundle of every webhook entry of the target's configurations."""
        found: list[bytes] = []
        for name in self.target.mutating_configs:
            cfg = self.admission.read_mutating_webhook_configuration(name)
            found += [_ca_bytes(w.client_config.ca_bundle) for w in cfg.webhooks]
        for name in self.target.validating_configs:
            cfg = self.admission.read_validating_webhook_configuration(name)
            found += [_ca_bytes(w.client_config.ca_bundle) for w in cfg.webhooks]
        return found

    def config_versions(self) -> list[str]:
        m = self.target.mutating_configs[0]
        v = self.target.validating_configs[0]
        return [
            self.admission.read_mutating_webhook_configuration(m).metadata.resource_version,
            self.admission.read_validating_webhook_configuration(v).metadata.resource_version,
        ]


def _ca_bytes(value: str | bytes | None) -> bytes:
    """The caBundle as PEM, however the client model hands it over."""
    assert value, "caBundle is empty"
    raw = value if isinstance(value, bytes) else value.encode()
    return raw if raw.startswith(b"-----BEGIN") else base64.b64decode(raw)


@pytest.fixture
def cluster(apiserver: ControlPlane) -> Iterator[Cluster]:
    """A fresh namespace plus a Mutating- and a ValidatingWebhookConfiguration (2 hooks each)."""
    suffix = uuid.uuid4().hex[:6]
    namespace = f"certs-{suffix}"
    core: Any = client.CoreV1Api(apiserver.admin)
    admission: Any = client.AdmissionregistrationV1Api(apiserver.admin)
    core.create_namespace({"metadata": {"name": namespace}})
    mutating, validating = f"fairgate-mutating-{suffix}", f"fairgate-validating-{suffix}"
    hooks = [_webhook(f"{k}.fairgate.io", namespace) for k in ("pods", "quota")]
    admission.create_mutating_webhook_configuration(
        {"metadata": {"name": mutating}, "webhooks": hooks}
    )
    admission.create_validating_webhook_configuration(
        {"metadata": {"name": validating}, "webhooks": hooks}
    )
    target = WebhookTarget(
        namespace=namespace,
        mutating_configs=(mutating,),
        validating_configs=(validating,),
        extra_sans=("127.0.0.1",),
    )
    try:
        yield Cluster(apiserver, target)
    finally:
        admission.delete_mutating_webhook_configuration(mutating)
        admission.delete_validating_webhook_configuration(validating)
        core.delete_namespace(namespace)


def race(
    plane: ControlPlane, run: Callable[[client.ApiClient, int], Bundle], replicas: int = REPLICAS
) -> list[Bundle]:
    """Run ``run(api_client, replica_index)`` in ``replicas`` threads released together."""
    barrier = threading.Barrier(replicas)
    results: list[Bundle | None] = [None] * replicas
    errors: list[BaseException] = []
    apis = [replica_client(plane) for _ in range(replicas)]

    def replica(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = run(apis[i], i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(replicas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for api in apis:
        api.close()  # type: ignore[no-untyped-call]
    assert not errors, errors
    return [r for r in results if r is not None]


def log_count(caplog: pytest.LogCaptureFixture, fragment: str) -> int:
    return sum(fragment in r.getMessage() for r in caplog.records)


def test_concurrent_bootstraps_yield_one_ca(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="certs.bootstrap")
    dirs = [tmp_path / f"replica-{i}" for i in range(REPLICAS)]
    bundles = race(cluster.plane, lambda api, i: ensure_certificates(api, cluster.target, dirs[i]))

    assert log_count(caplog, "with a new CA") == 1  # exactly one replica created the Secret
    stored = cluster.secret_bundle()
    assert all(b == stored for b in bundles)
    assert all(load_bundle(d) == stored for d in dirs)
    assert cluster.secret().type == "kubernetes.io/tls"
    assert cluster.ca_bundles() == [stored.ca_cert_pem] * 4
    name = x509.DNSName(f"fairgate-webhook.{cluster.target.namespace}.svc")
    verifier = PolicyBuilder().store(Store(stored.ca_certs)).build_server_verifier(name)
    verifier.verify(stored.cert, [])


def test_bootstrap_is_idempotent_and_writes_nothing_when_nothing_is_due(
    cluster: Cluster, tmp_path: Path
) -> None:
    first = ensure_certificates(cluster.plane.admin, cluster.target, tmp_path)
    secret_version = cluster.secret().metadata.resource_version
    config_versions = cluster.config_versions()
    assert ensure_certificates(cluster.plane.admin, cluster.target, tmp_path) == first
    assert cluster.secret().metadata.resource_version == secret_version
    assert cluster.config_versions() == config_versions


def test_concurrent_renewals_renew_once_in_place_with_the_same_ca(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    original = ensure_certificates(cluster.plane.admin, cluster.target, tmp_path / "seed")
    uid = cluster.secret().metadata.uid
    caplog.set_level(logging.INFO, logger="certs.bootstrap")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=250)  # past 2/3 of the serving year
    dirs = [tmp_path / f"replica-{i}" for i in range(REPLICAS)]
    bundles = race(
        cluster.plane,
        lambda api, i: ensure_certificates(api, cluster.target, dirs[i], now=later),
    )

    assert log_count(caplog, "renewed the certificate") == 1
    stored = cluster.secret_bundle()
    assert cluster.secret().metadata.uid == uid  # updated in place, not recreated
    assert all(b == stored for b in bundles)
    assert all(load_bundle(d) == stored for d in dirs)
    assert stored.ca_cert_pem == original.ca_cert_pem
    assert stored.ca_key_pem == original.ca_key_pem
    assert stored.cert.serial_number != original.cert.serial_number
    assert stored.cert.not_valid_after_utc > original.cert.not_valid_after_utc
    assert cluster.ca_bundles() == [original.ca_cert_pem] * 4


def test_a_broken_secret_is_replaced_and_the_ca_bundle_follows(
    cluster: Cluster, tmp_path: Path
) -> None:
    original = ensure_certificates(cluster.plane.admin, cluster.target, tmp_path)
    cluster.core.patch_namespaced_secret(
        cluster.target.secret_name,
        cluster.target.namespace,
        {"data": {"tls.key": base64.b64encode(b"garbage").decode()}},
    )
    fresh = ensure_certificates(cluster.plane.admin, cluster.target, tmp_path)
    assert fresh.ca_cert_pem != original.ca_cert_pem
    assert cluster.secret_bundle() == fresh
    assert load_bundle(tmp_path) == fresh
    assert cluster.ca_bundles() == [fresh.ca_cert_pem] * 4


def test_a_missing_webhook_configuration_is_named(cluster: Cluster, tmp_path: Path) -> None:
    target = WebhookTarget(
        namespace=cluster.target.namespace, validating_configs=("no-such-config",)
    )
    with pytest.raises(BootstrapError, match=r"no-such-config.*404.*apply the manifests"):
        ensure_certificates(cluster.plane.admin, target, tmp_path)


def test_missing_rbac_is_explained(cluster: Cluster, tmp_path: Path) -> None:
    nobody = cluster.plane.client_for("someone-without-rbac")
    with pytest.raises(BootstrapError, match=r"reading Secret .*403.*RBAC"):
        ensure_certificates(nobody, cluster.target, tmp_path)
    with pytest.raises(ApiException):  # sanity: the client really is refused
        client.CoreV1Api(nobody).list_namespaced_secret(cluster.target.namespace)


@pytest.fixture
def short_lived(cluster: Cluster) -> WebhookTarget:
    """The cluster's target with a serving cert so short that it is always due for renewal.

    (Certificates start 5 minutes early for clock skew, so two-thirds of a 60 s lifetime
    has passed the moment one is issued.)
    """
    return replace(cluster.target, serving_validity=dt.timedelta(seconds=60))


@pytest.fixture
def cert_dir(cluster: Cluster, short_lived: WebhookTarget, tmp_path: Path) -> Path:
    """Overrides the conftest's: the HTTPS server starts from the cluster's bootstrap."""
    out = tmp_path / "served"
    ensure_certificates(cluster.plane.admin, short_lived, out)
    return out


def test_maintenance_renews_in_the_cluster_and_the_running_server_picks_it_up(
    cluster: Cluster, short_lived: WebhookTarget, https_server: HttpsServer
) -> None:
    first = https_server.peer_serial()
    initial = cluster.secret_bundle()
    assert first == initial.cert.serial_number
    stop = threading.Event()
    maintainer = threading.Thread(
        target=maintain_certificates,
        args=(cluster.plane.admin, short_lived, https_server.cert_dir),
        kwargs={"stop": stop, "interval": 0.2},
    )
    maintainer.start()
    try:
        assert https_server.reload_seen.wait(30), "the server never reloaded a renewed cert"
    finally:
        stop.set()
        maintainer.join(30)
    stored = cluster.secret_bundle()
    deadline = time.monotonic() + 10
    while https_server.peer_serial() != stored.cert.serial_number:
        assert time.monotonic() < deadline, "the server did not converge on the Secret's cert"
        time.sleep(0.05)
    assert stored.cert.serial_number != first
    assert stored.ca_cert_pem == initial.ca_cert_pem  # renewed with the same CA
    assert load_bundle(https_server.cert_dir) == stored
    assert cluster.ca_bundles() == [stored.ca_cert_pem] * 4


def test_the_documented_least_privilege_rbac_is_enough(cluster: Cluster, tmp_path: Path) -> None:
    """Exactly the verbs certs.bootstrap documents, scoped by name where RBAC allows it."""
    user = f"webhook-{uuid.uuid4().hex[:6]}"
    ns, secret = cluster.target.namespace, cluster.target.secret_name
    subject = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    rbac: Any = client.RbacAuthorizationV1Api(cluster.plane.admin)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": user},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [secret],
                    "verbs": ["get", "patch"],
                },
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
            "subjects": subject,
        },
    )
    group = "admissionregistration.k8s.io"
    rbac.create_cluster_role(
        {
            "metadata": {"name": user},
            "rules": [
                {
                    "apiGroups": [group],
                    "resources": ["mutatingwebhookconfigurations"],
                    "resourceNames": list(cluster.target.mutating_configs),
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": [group],
                    "resources": ["validatingwebhookconfigurations"],
                    "resourceNames": list(cluster.target.validating_configs),
                    "verbs": ["get", "patch"],
                },
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": user,
            },
            "subjects": subject,
        }
    )
    try:
        api = cluster.plane.client_for(user)
        review: Any = client.AuthorizationV1Api(api)

        def allowed(attributes: dict[str, str]) -> bool:
            body = {"spec": {"resourceAttributes": attributes}}
            return bool(review.create_self_subject_access_review(body).status.allowed)

        validating = cluster.target.validating_configs[0]
        checks = [
            {"namespace": ns, "verb": "create", "resource": "secrets"},
            {
                "group": group,
                "verb": "patch",
                "resource": "validatingwebhookconfigurations",
                "name": validating,
            },
        ]
        wait_for(lambda: all(allowed(c) for c in checks), 10, "the RBAC rules to take effect")
        created = ensure_certificates(api, cluster.target, tmp_path)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=250)
        renewed = ensure_certificates(api, cluster.target, tmp_path, now=later)
        assert renewed.cert.serial_number != created.cert.serial_number
        assert cluster.secret_bundle() == renewed
        assert cluster.ca_bundles() == [created.ca_cert_pem] * 4
    finally:
        rbac.delete_cluster_role_binding(user)
        rbac.delete_cluster_role(user)

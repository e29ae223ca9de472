"""Cluster certificate bootstrap: one shared Secret, files for the server, caBundle injection.

``ensure_certificates(api, target, cert_dir)`` is idempotent and safe to run from every
webhook replica at once, at start and then periodically (``maintain_certificates``):

1. The Secret ``target.secret_name`` in ``target.namespace`` (keys ``ca.crt``,
   ``ca.key``, ``tls.crt``, ``tls.key``, type ``kubernetes.io/tls``) is created if
   absent. Replicas racing to create it end with ONE CA: the loser of the 409
   AlreadyExists reads and uses the winner's Secret.
2. When the Secret's serving cert is due (two-thirds of its lifetime, or its SANs no
   longer match the Service) it is renewed with the same CA, or the CA too when that is
   due (see ``certs.generate.refresh_bundle``), by an update guarded by the Secret's
   resourceVersion (a merge patch carrying it, so a stale writer gets 409); a replica
   that loses that race re-reads and adopts the winner's. A Secret whose content is
   broken is replaced by a fresh bundle the same way.
3. The bundle is written into ``cert_dir`` (for ``CertReloader`` to pick up) when it
   differs from what is there.
4. ``ca.crt`` is set as ``clientConfig.caBundle`` of every webhook entry of the named
   Mutating- and ValidatingWebhookConfigurations (a merge patch guarded by their
   resourceVersion; nothing is sent when they already carry it).

RBAC the caller's ServiceAccount needs: ``create`` on ``secrets`` in the namespace (create
cannot be limited by name) plus ``get``, ``patch`` on that Secret by name, and ``get``,
``patch`` on the named ``mutatingwebhookconfigurations`` /
``validatingwebhookconfigurations``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import (
    AdmissionregistrationV1Api,
    ApiClient,
    CoreV1Api,
    V1ObjectMeta,
    V1Secret,
)
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from certs.generate import (
    BUNDLE_FILES,
    CA_VALIDITY,
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    SERVING_VALIDITY,
    Bundle,
    CertError,
    refresh_bundle,
    save_bundle,
)

log = logging.getLogger(__name__)

DEFAULT_SECRET = "fairgate-webhook-tls"
_ATTEMPTS = 8
_TIMEOUT = 10.0
_MERGE_PATCH = "application/merge-patch+json"


class BootstrapError(RuntimeError):
    """The cluster refused or could not complete a certificate bootstrap step."""


@dataclass(frozen=True)
class WebhookTarget:
    """Which Service the certificate names, where it is kept, and who trusts it."""

    namespace: str = DEFAULT_NAMESPACE
    service: str = DEFAULT_SERVICE
    secret_name: str = DEFAULT_SECRET
    mutating_configs: tuple[str, ...] = ()
    validating_configs: tuple[str, ...] = ()
    extra_sans: tuple[str, ...] = ()
    ca_validity: dt.timedelta = CA_VALIDITY
    serving_validity: dt.timedelta = SERVING_VALIDITY
    # The Secret's label app.kubernetes.io/component (the console's: console-tls).
    component: str = "webhook-tls"


def _error(exc: ApiException, action: str) -> BootstrapError:
    hint = ""
    if exc.status == 403:
        hint = " (the ServiceAccount lacks RBAC for this: see certs.bootstrap's docstring)"
    elif exc.status == 404:
        hint = " (it does not exist: apply the manifests first)"
    return BootstrapError(f"{action}: HTTP {exc.status} {exc.reason}{hint}")


def _json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data)
    return data


def _secret_bundle(secret: dict[str, Any], source: str) -> Bundle | None:
    data = secret.get("data") or {}
    try:
        files = {k: base64.b64decode(data[k]) for k in BUNDLE_FILES if k in data}
        return Bundle.from_files(files, source=source)
    except (CertError, ValueError) as exc:
        log.warning("replacing unusable certificate Secret: %s", exc)
        return None


def _secret_data(bundle: Bundle) -> dict[str, bytes | str]:
    """Secret ``data``: base64 text per key (the client would send raw bytes as is)."""
    return {k: base64.b64encode(v).decode() for k, v in bundle.as_files().items()}


def _guarded_patch(
    patch: Callable[..., Any], args: tuple[str, ...], obj: dict[str, Any], changes: dict[str, Any]
) -> bool:
    """Merge-patch ``changes`` into ``obj`` unless it changed since read; False on 409."""
    body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, **changes}
    try:
        patch(*args, body, _content_type=_MERGE_PATCH, _request_timeout=_TIMEOUT)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def ensure_secret(
    core: CoreV1Api, target: WebhookTarget, *, now: dt.datetime | None = None
) -> Bundle:
    """The bundle held by the target Secret, created or renewed first when needed."""
    ns, name = target.namespace, target.secret_name
    source = f"Secret {ns}/{name}"

    def wanted(current: Bundle | None) -> Bundle:
        return refresh_bundle(
            current,
            target.service,
            target.namespace,
            target.extra_sans,
            ca_validity=target.ca_validity,
            serving_validity=target.serving_validity,
            now=now,
        )

    for _ in range(_ATTEMPTS):
        try:
            secret = _json(
                core.read_namespaced_secret(
                    name, ns, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _error(exc, f"reading {source}") from exc
            bundle = wanted(None)
            body = V1Secret(
                metadata=V1ObjectMeta(name=name, namespace=ns, labels={
                    "app.kubernetes.io/name": "fairgate",
                    "app.kubernetes.io/component": target.component,
                }),
                type="kubernetes.io/tls",
                data=_secret_data(bundle),
            )
            try:
                core.create_namespaced_secret(ns, body, _request_timeout=_TIMEOUT)
            except ApiException as exc2:
                if exc2.status == 409:
                    log.info("%s was created concurrently; adopting it", source)
                    continue
                raise _error(exc2, f"creating {source}") from exc2
            log.info("created %s with a new CA", source)
            return bundle
        current = _secret_bundle(secret, source)
        bundle = wanted(current)
        if bundle is current:
            return bundle
        try:
            updated = _guarded_patch(
                core.patch_namespaced_secret, (name, ns), secret, {"data": _secret_data(bundle)}
            )
        except ApiException as exc:
            raise _error(exc, f"updating {source}") from exc
        if updated:
            log.info("renewed the certificate in %s", source)
            return bundle
        log.info("%s was updated concurrently; re-reading it", source)
    raise BootstrapError(f"{source} kept changing under us after {_ATTEMPTS} attempts")


def inject_ca_bundle(
    admission: AdmissionregistrationV1Api, kind: str, name: str, ca_pem: bytes
) -> bool:
    """Set ``ca_pem`` as caBundle of every webhook in the named configuration.

    ``kind`` is ``"mutating"`` or ``"validating"``. True if the configuration changed.
    """
    if kind not in ("mutating", "validating"):
        raise ValueError(f"kind must be 'mutating' or 'validating', got {kind!r}")
    read: Callable[..., Any] = getattr(admission, f"read_{kind}_webhook_configuration")
    patch: Callable[..., Any] = getattr(admission, f"patch_{kind}_webhook_configuration")
    what = f"{kind.capitalize()}WebhookConfiguration {name}"
    ca_b64 = base64.b64encode(ca_pem).decode()
    for _ in range(_ATTEMPTS):
        try:
            config = _json(read(name, _preload_content=False, _request_timeout=_TIMEOUT))
        except ApiException as exc:
            raise _error(exc, f"reading {what}") from exc
        hooks: list[dict[str, Any]] = config.get("webhooks") or []
        if all(h.get("clientConfig", {}).get("caBundle") == ca_b64 for h in hooks):
            return False
        for hook in hooks:
            hook.setdefault("clientConfig", {})["caBundle"] = ca_b64
        try:
            if _guarded_patch(patch, (name,), config, {"webhooks": hooks}):
                log.info("patched caBundle into %s", what)
                return True
        except ApiException as exc:
            raise _error(exc, f"patching caBundle into {what}") from exc
    raise BootstrapError(f"{what} kept changing under us after {_ATTEMPTS} attempts")


def _files_differ(bundle: Bundle, cert_dir: Path) -> bool:
    for fname, content in bundle.as_files().items():
        path = cert_dir / fname
        if not path.is_file() or path.read_bytes() != content:
            return True
    return False


def ensure_certificates(
    api: ApiClient, target: WebhookTarget, cert_dir: Path, *, now: dt.datetime | None = None
) -> Bundle:
    """Run the whole bootstrap (see the module docstring) and return the bundle in use.

    Raises BootstrapError when the API server refuses a step (the message names the
    object and, for 403, points at the RBAC needed) and CertError for bad target names.
    """
    bundle = ensure_secret(CoreV1Api(api), target, now=now)
    if _files_differ(bundle, cert_dir):
        save_bundle(bundle, cert_dir)
    admission = AdmissionregistrationV1Api(api)
    for name in target.mutating_configs:
        inject_ca_bundle(admission, "mutating", name, bundle.ca_cert_pem)
    for name in target.validating_configs:
        inject_ca_bundle(admission, "validating", name, bundle.ca_cert_pem)
    return bundle


def maintain_certificates(
    api: ApiClient,
    target: WebhookTarget,
    cert_dir: Path,
    *,
    stop: threading.Event,
    interval: float = 3600.0,
) -> None:
    """Re-run ``ensure_certificates`` every ``interval`` seconds until ``stop`` is set.

    Meant for a daemon thread next to the server. A failed round is logged and retried
    at the next one: renewal is due with a third of the lifetime left, so short API
    outages are harmless.
    """
    while not stop.wait(interval):
        try:
            ensure_certificates(api, target, cert_dir)
        except (BootstrapError, ApiException, HTTPError, OSError) as exc:
            log.warning("certificate maintenance failed, retrying in %.0fs: %s", interval, exc)

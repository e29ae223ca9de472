"""fairgate certs: the webhook's CA and serving certificate, TLS serving, cluster bootstrap.

Stands alone: imports nothing else of fairgate.

Files (``certs.generate``), also the keys of the cluster Secret:
``ca.crt`` (trust bundle, issuing CA first; this is the webhook ``caBundle``),
``ca.key`` (0600, kept only to renew the serving cert), ``tls.crt``, ``tls.key`` (0600).
ECDSA P-256; CA 10 years, serving cert 1 year; renewal due at two-thirds of a lifetime.

Public API:

- ``write_bundle(out_dir, service="fairgate-webhook", namespace="fairgate-system",
  extra_sans=()) -> CertPaths``: new CA + serving cert into a dir (``fairgate certs
  generate``). SANs: ``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc``,
  ``<svc>.<ns>.svc.cluster.local``, then each extra DNS name or IP address.
- ``new_bundle``, ``renew_serving_cert``, ``refresh_bundle``, ``needs_renewal``,
  ``save_bundle``, ``load_bundle``: the same in memory (``Bundle``) and the renewal policy.
- ``server_ssl_context(cert_dir) -> ssl.SSLContext``: TLS 1.2+ server context.
- ``CertReloader(context, cert_dir, interval=1.0)``: hot-swaps a changed tls.crt/tls.key
  into that live context; run it on the server's event loop (``async with
  reloader.running(): await uvicorn_server.serve()``), see ``certs.tls``.
- ``certs.bootstrap`` (imports the kubernetes client, so import it explicitly):
  ``ensure_certificates(api_client, WebhookTarget(...), cert_dir) -> Bundle`` and
  ``maintain_certificates(..., stop=threading.Event(), interval=3600.0)``.

Errors: ``CertError`` (a ``ValueError``) for bad names or bad certificate material,
``certs.bootstrap.BootstrapError`` when the API server refuses a step.
"""

from certs.generate import (
    CA_VALIDITY,
    SERVING_VALIDITY,
    Bundle,
    CertError,
    CertPaths,
    load_bundle,
    needs_renewal,
    new_bundle,
    refresh_bundle,
    renew_serving_cert,
    save_bundle,
    serving_names,
    write_bundle,
)
from certs.tls import CertReloader, server_ssl_context

__all__ = [
    "CA_VALIDITY",
    "SERVING_VALIDITY",
    "Bundle",
    "CertError",
    "CertPaths",
    "CertReloader",
    "load_bundle",
    "needs_renewal",
    "new_bundle",
    "refresh_bundle",
    "renew_serving_cert",
    "save_bundle",
    "server_ssl_context",
    "serving_names",
    "write_bundle",
]

"""The Redis password Secret: created once in the cluster, read by Redis and its clients.

kustomize cannot make random values, so the Secret ``fairgate-redis-auth`` is made by
fairgate itself: the webhook Deployment's init container runs ``fairgate redis-secret``,
which calls :func:`ensure_redis_secret` before any fairgate container starts. The Redis
StatefulSet and both fairgate Deployments reference the Secret without ``optional``,
so their containers wait until it exists, then read it.

Keys (type ``Opaque``):

- ``password``: 32 random bytes, URL-safe base64 (43 characters). fairgate's clients
  read it as ``$REDIS_PASSWORD`` (see :mod:`fairshare.connection`); an operator may
  set their own.
- ``users.acl``: the Redis ACL file derived from ``password`` (:func:`acl_file`): the
  ``default`` user, all commands and keys, the password only as its SHA-256. Redis is
  started with ``--aclfile`` pointing at it, so no client gets in without the password.

:func:`ensure_redis_secret` is idempotent and safe from every replica at once: it
creates the Secret when absent (the loser of a create race adopts the winner's), and
when ``users.acl`` is missing or does not match ``password`` (an operator rotated the
password) it rewrites ``users.acl`` with a patch guarded by the resourceVersion. The
password itself is never logged or returned.

RBAC: ``create`` on ``secrets`` in the namespace, ``get`` and ``patch`` on this Secret by
name (the webhook's ServiceAccount already creates ``fairgate-webhook-tls``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import secrets
from typing import Literal

from kubernetes.client import ApiClient, CoreV1Api, V1ObjectMeta, V1Secret
from kubernetes.client.exceptions import ApiException

from certs.bootstrap import _ATTEMPTS, _TIMEOUT, BootstrapError, _error, _guarded_patch, _json

log = logging.getLogger(__name__)

DEFAULT_REDIS_SECRET = "fairgate-redis-auth"
PASSWORD_KEY = "password"
ACL_KEY = "users.acl"
_LABELS = {"app.kubernetes.io/name": "fairgate", "app.kubernetes.io/component": "redis-auth"}

Outcome = Literal["created", "unchanged", "updated"]


def new_password() -> str:
    """A fresh random password (256 bits, URL-safe: no quoting needed anywhere)."""
    return secrets.token_urlsafe(32)


def acl_file(password: str) -> str:
    """The Redis ACL file for ``password``: user ``default``, everything, hashed password."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user default on #{digest} ~* &* +@all\n"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _decoded(data: dict[str, str], key: str, source: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise BootstrapError(f"{source}: key {key!r} is not base64 UTF-8 text ({exc})") from exc


def ensure_redis_secret(
    api: ApiClient, namespace: str, name: str = DEFAULT_REDIS_SECRET
) -> Outcome:
    """Make sure the Secret exists and its ``users.acl`` matches its ``password`` (see the
    module docstring); what was done. Raises :class:`certs.bootstrap.BootstrapError`."""
    core = CoreV1Api(api)
    source = f"Secret {namespace}/{name}"
    for _ in range(_ATTEMPTS):
        try:
            secret = _json(core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=_TIMEOUT))
        except ApiException as exc:
            if exc.status != 404:
                raise _error(exc, f"reading {source}") from exc
            password = new_password()
            body = V1Secret(
                metadata=V1ObjectMeta(name=name, namespace=namespace, labels=_LABELS),
                type="Opaque",
                data={PASSWORD_KEY: _b64(password), ACL_KEY: _b64(acl_file(password))},
            )
            try:
                core.create_namespaced_secret(namespace, body, _request_timeout=_TIMEOUT)
            except ApiException as exc2:
                if exc2.status == 409:
                    log.info("%s was created concurrently; adopting it", source)
                    continue
                raise _error(exc2, f"creating {source}") from exc2
            log.info("created %s with a new random Redis password", source)
            return "created"
        data = secret.get("data") or {}
        current = _decoded(data, PASSWORD_KEY, source)
        if not current:
            raise BootstrapError(
                f"{source} has no key {PASSWORD_KEY!r}: add one (kubectl -n {namespace} "
                f"patch secret {name} -p '{{\"stringData\":{{\"password\":\"...\"}}}}') or "
                "delete the Secret to have a random password generated"
            )
        wanted = acl_file(current)
        if _decoded(data, ACL_KEY, source) == wanted:
            return "unchanged"
        try:
            updated = _guarded_patch(core.patch_namespaced_secret, (name, namespace), secret,
                                     {"data": {ACL_KEY: _b64(wanted)}})
        except ApiException as exc:
            raise _error(exc, f"updating {source}") from exc
        if updated:
            log.info("rewrote %s in %s to match its password", ACL_KEY, source)
            return "updated"
        log.info("%s was updated concurrently; re-reading it", source)
    raise BootstrapError(f"{source} kept changing under us after {_ATTEMPTS} attempts")

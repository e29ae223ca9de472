"""TLS serving from a cert dir, with hot reload of the serving certificate.

``server_ssl_context(cert_dir)`` builds a server ``SSLContext`` (TLS 1.2 minimum, ECDHE
AEAD ciphers for TLS 1.2) from ``tls.crt``/``tls.key``. ``CertReloader`` polls those two
files and, when their content changes to a matching certificate/key pair, loads the new
pair into the *same* live context: connections already open (and handshakes already
under way) keep the certificate they started with, every later handshake gets the new
one, and the server never restarts.

Use with uvicorn (the context is handed over as is through ``ssl_context_factory``)::

    ctx = server_ssl_context(cert_dir)
    reloader = CertReloader(ctx, cert_dir)
    config = uvicorn.Config(app, host=..., port=..., ssl_context_factory=lambda _c, _d: ctx)
    server = uvicorn.Server(config)

    async def main() -> None:
        async with reloader.running():
            await server.serve()

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # uvloop if set
        runner.run(main())

The reloader must run on the event loop that serves the connections: OpenSSL replaces
a context's certificate and key in two steps, and a handshake starting between them
would fail, so the swap happens on the loop thread where no handshake can interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from certs.generate import CERT_FILE, KEY_FILE, CertError, require_key_matches

log = logging.getLogger(__name__)

_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@contextlib.contextmanager
def _pem_path(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open holding ``data``, kept off disk where the OS allows."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("fairgate-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
    else:
        fd, tmp = tempfile.mkstemp(prefix="fairgate-tls-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            yield tmp
        finally:
            os.unlink(tmp)


def _read_pair(cert_dir: Path) -> tuple[bytes, bytes]:
    return (cert_dir / CERT_FILE).read_bytes(), (cert_dir / KEY_FILE).read_bytes()


def _checked_pem(cert_pem: bytes, key_pem: bytes, *, source: str) -> tuple[bytes, x509.Certificate]:
    """Key plus certificate as one PEM, after checking they belong together."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertError(f"{source}/{CERT_FILE}: unreadable certificate PEM ({exc})") from exc
    require_key_matches(cert, key_pem, what=f"{source}/{KEY_FILE}")
    return cert_pem.rstrip(b"\n") + b"\n" + key_pem, cert


def _load_into(context: ssl.SSLContext, combined_pem: bytes) -> None:
    with _pem_path(combined_pem) as path:
        context.load_cert_chain(path)


@dataclass
class _Rejection:
    """A cert/key content that failed to load, and for how many polls it has stayed."""

    digest: bytes
    reason: str
    polls: int = 0


def _new_server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(_TLS12_CIPHERS)
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_COMPRESSION
    return context


def server_ssl_context(cert_dir: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving ``cert_dir``/tls.crt with ``cert_dir``/tls.key.

    Raises CertError when the files are missing, unreadable or do not belong together.
    """
    try:
        cert_pem, key_pem = _read_pair(cert_dir)
    except OSError as exc:
        raise CertError(
            f"cannot read the serving certificate in {cert_dir} ({exc}); create it with "
            "`fairgate certs generate --out DIR`"
        ) from exc
    combined, _ = _checked_pem(cert_pem, key_pem, source=str(cert_dir))
    context = _new_server_context()
    _load_into(context, combined)
    return context


class CertReloader:
    """Keeps a live server ``SSLContext`` serving the current tls.crt/tls.key of a dir.

    Changes are detected by content hash. A pair that is missing, unreadable or
    mismatched (e.g. caught halfway through a rotation) is ignored and the previous
    certificate keeps serving until a good pair appears; a bad pair that is still there
    after ``STALE_POLLS`` polls is logged as a warning.
    """

    STALE_POLLS = 5

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_dir: Path,
        *,
        interval: float = 1.0,
        on_reload: Callable[[x509.Certificate], None] | None = None,
    ) -> None:
        """Watch ``cert_dir`` every ``interval`` seconds; ``on_reload`` gets each new cert.

        ``context`` is assumed to hold the pair currently in ``cert_dir``.
        """
        if interval <= 0:
            raise ValueError(f"interval must be positive seconds, got {interval}")
        self._context = context
        self._cert_dir = cert_dir
        self._interval = interval
        self._on_reload = on_reload
        current = self._read()
        self._digest = current[2] if current else None
        self._rejected: _Rejection | None = None

    def _read(self) -> tuple[bytes, bytes, bytes] | None:
        """cert PEM, key PEM and their digest; None while a file is missing."""
        try:
            cert_pem, key_pem = _read_pair(self._cert_dir)
        except OSError:
            return None
        return cert_pem, key_pem, hashlib.sha256(cert_pem + b"\0" + key_pem).digest()

    def check(self) -> bool:
        """Reload now if the files changed to a good pair; True if a new cert was loaded.

        Call it only from the thread running the serving event loop (``run`` does).
        """
        current = self._read()
        if current is None:
            return False
        cert_pem, key_pem, digest = current
        if digest == self._digest:
            return False
        if self._rejected is not None and digest == self._rejected.digest:
            self._rejected.polls += 1
            if self._rejected.polls == self.STALE_POLLS:
                log.warning("serving certificate not reloaded: %s", self._rejected.reason)
            return False
        try:
            combined, cert = _checked_pem(cert_pem, key_pem, source=str(self._cert_dir))
            _load_into(_new_server_context(), combined)  # prove it loads before going live
        except (CertError, ssl.SSLError) as exc:
            self._rejected = _Rejection(digest, str(exc))
            log.info("waiting for a matching certificate and key: %s", exc)
            return False
        _load_into(self._context, combined)
        self._digest = digest
        log.info("reloaded serving certificate, serial %x", cert.serial_number)
        if self._on_reload is not None:
            self._on_reload(cert)
        return True

    async def run(self) -> None:
        """Poll forever (until cancelled) on the current event loop."""
        while True:
            await asyncio.sleep(self._interval)
            self.check()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run ``run`` as a task on the current loop for the duration of the block."""
        task = asyncio.create_task(self.run(), name="fairgate-cert-reloader")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

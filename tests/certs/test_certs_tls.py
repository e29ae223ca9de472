"""TLS serving over a real uvicorn server: protocol floor, names, and hot certificate swaps."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from certs_https import SERVICE_DNS, HttpsServer
from cryptography import x509

from certs import (
    CertError,
    CertReloader,
    load_bundle,
    new_bundle,
    renew_serving_cert,
    save_bundle,
    server_ssl_context,
)

EXTRAS = ["127.0.0.1", "localhost"]
V = ssl.TLSVersion


def client_context(ca_file: Path, lowest: V, highest: V) -> ssl.SSLContext:
    """A verifying client limited to [lowest, highest], with legacy protocols enabled."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = lowest
    context.maximum_version = highest
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let OpenSSL 3 offer TLS 1.0/1.1 at all
    return context


def handshake(port: int, context: ssl.SSLContext, hostname: str = "127.0.0.1") -> str:
    """Negotiated protocol version of one verified handshake with 127.0.0.1:port."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        version = tls.version()
    assert version is not None
    return version


def one_shot_server(context: ssl.SSLContext) -> int:
    """A plain ssl server on 127.0.0.1 that completes one handshake; returns its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as conn, context.wrap_socket(conn, server_side=True):
            pass

    threading.Thread(target=serve, daemon=True).start()
    port: int = listener.getsockname()[1]
    return port


def served_serial(context: ssl.SSLContext, ca_file: Path) -> int:
    """Serial of the certificate ``context`` presents in a fresh handshake."""
    server_sock, client_sock = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with context.wrap_socket(server_sock, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=ca_file)
    with client.wrap_socket(client_sock, server_hostname=SERVICE_DNS) as tls:
        der = tls.getpeercert(binary_form=True)
    thread.join(5)
    assert not errors, errors
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_is_refused_while_1_2_and_1_3_are_served(https_server: HttpsServer) -> None:
    ca = https_server.cert_dir / "ca.crt"
    tls11 = client_context(ca, V.TLSv1_1, V.TLSv1_1)
    # Control: this client really can speak TLS 1.1 to a server that allows it ...
    lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lax.minimum_version = V.TLSv1_1
    lax.set_ciphers("DEFAULT:@SECLEVEL=0")
    lax.load_cert_chain(https_server.cert_dir / "tls.crt", https_server.cert_dir / "tls.key")
    assert handshake(one_shot_server(lax), tls11) == "TLSv1.1"
    # ... but fairgate's server refuses it.
    with pytest.raises(ssl.SSLError):  # alert or bare EOF, depending on the event loop
        handshake(https_server.port, tls11)
    assert handshake(https_server.port, client_context(ca, V.TLSv1_2, V.TLSv1_2)) == "TLSv1.2"
    assert handshake(https_server.port, ssl.create_default_context(cafile=ca)) == "TLSv1.3"


def test_httpx_verifying_the_ca_gets_answers_over_tls_1_2(https_server: HttpsServer) -> None:
    tls12 = client_context(https_server.cert_dir / "ca.crt", V.TLSv1_2, V.TLSv1_2)
    with httpx.Client(verify=tls12) as client:
        response = client.get(f"{https_server.url}/")
    assert response.status_code == 200
    assert response.text == "ok"


def test_the_service_dns_name_verifies_and_a_foreign_name_does_not(
    https_server: HttpsServer,
) -> None:
    context = https_server.client_context()
    assert handshake(https_server.port, context, SERVICE_DNS) == "TLSv1.3"
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(https_server.port, context, "other.fairgate-system.svc")


def test_server_context_explains_missing_or_mismatched_files(tmp_path: Path) -> None:
    with pytest.raises(CertError, match=r"cannot read the serving certificate.*certs generate"):
        server_ssl_context(tmp_path)
    save_bundle(new_bundle(), tmp_path)
    (tmp_path / "tls.key").write_bytes(new_bundle().key_pem)
    with pytest.raises(CertError, match="does not match"):
        server_ssl_context(tmp_path)


def test_reloader_waits_for_a_matching_pair_then_swaps_the_live_context(
    cert_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca_file = cert_dir / "ca.crt"
    first = load_bundle(cert_dir)
    context = server_ssl_context(cert_dir)
    reloader = CertReloader(context, cert_dir)
    assert not reloader.check()  # nothing changed
    renewed = renew_serving_cert(first, extra_sans=EXTRAS)
    (cert_dir / "tls.key").write_bytes(renewed.key_pem)  # caught halfway through a rotation
    assert not reloader.check()
    assert served_serial(context, ca_file) == first.cert.serial_number

    # A pair that stays mismatched is warned about once, after STALE_POLLS more polls.
    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.WARNING]

    for _ in range(CertReloader.STALE_POLLS - 1):
        assert not reloader.check()
    assert warnings() == []
    for _ in range(3):
        assert not reloader.check()
    assert [r.getMessage() for r in warnings()] == [
        f"serving certificate not reloaded: {cert_dir}/tls.key: private key does not match "
        "its certificate"
    ]
    (cert_dir / "tls.crt").write_bytes(renewed.cert_pem)
    assert reloader.check()
    assert served_serial(context, ca_file) == renewed.cert.serial_number
    assert not reloader.check()
    (cert_dir / "tls.crt").unlink()  # a vanished file keeps the current certificate
    assert not reloader.check()
    assert served_serial(context, ca_file) == renewed.cert.serial_number


def _serial_of(response: httpx.Response) -> int:
    tls = response.extensions["network_stream"].get_extra_info("ssl_object")
    der = tls.getpeercert(True)  # binary form; httpcore hands out the C-level object
    return x509.load_der_x509_certificate(der).serial_number


def _wait(
    condition: Callable[[], bool],
    what: str,
    timeout: float = 15.0,
    context: Callable[[], str] = str,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}{context()}"
        time.sleep(0.01)


@pytest.mark.slow
def test_rotation_under_load_fails_no_handshake_and_no_request(https_server: HttpsServer) -> None:
    """Clients hammer the server with new connections while the serving cert rotates 3 times.

    Every request succeeds; new connections pick up each new certificate as soon as it is
    loaded; requests in flight during a swap, and a keep-alive connection opened before
    the swaps, finish on the certificate they started with.
    """
    url = https_server.url
    app = https_server.app
    bundle = load_bundle(https_server.cert_dir)
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[str] = []
    new_conn_serials: dict[int, int] = {}  # serial -> requests on fresh connections

    def hammer() -> None:
        headers = {"Connection": "close"}  # one handshake per request
        with httpx.Client(verify=https_server.client_context(), headers=headers) as client:
            while not stop.is_set():
                try:
                    with client.stream("GET", f"{url}/") as response:
                        serial = _serial_of(response)
                        assert response.read() == b"ok"
                    with lock:
                        new_conn_serials[serial] = new_conn_serials.get(serial, 0) + 1
                except Exception as exc:
                    with lock:
                        failures.append(repr(exc))

    held_serials: list[int] = []

    def hold() -> None:
        with httpx.Client(verify=https_server.client_context(), timeout=30) as client:
            try:
                with client.stream("GET", f"{url}/hold") as response:
                    serial = _serial_of(response)
                    assert response.read() == b"ok"
                with lock:
                    held_serials.append(serial)
            except Exception as exc:
                with lock:
                    failures.append(f"in-flight request: {exc!r}")

    def status() -> str:
        with lock:
            return f" (requests by serial {new_conn_serials}, failures {failures[:3]})"

    def load_on(serial: int) -> Callable[[], bool]:
        return lambda: new_conn_serials.get(serial, 0) >= 20

    hammers = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in hammers:
        thread.start()
    keep_alive = httpx.Client(verify=https_server.client_context())
    try:
        serials = [bundle.cert.serial_number]
        with keep_alive.stream("GET", f"{url}/") as response:
            assert _serial_of(response) == serials[0]
            response.read()
        _wait(load_on(serials[0]), "load on the first cert", context=status)
        for _ in range(3):
            app.release.clear()
            holders = [threading.Thread(target=hold) for _ in range(2)]
            for thread in holders:
                thread.start()
            _wait(lambda: app.held == 2, "two requests in flight", context=status)
            bundle = renew_serving_cert(bundle, extra_sans=EXTRAS)
            serials.append(bundle.cert.serial_number)
            https_server.reload_seen.clear()
            save_bundle(bundle, https_server.cert_dir)
            _wait(https_server.reload_seen.is_set, "the reloader", context=status)
            _wait(load_on(serials[-1]), "load on the new cert", context=status)
            app.release.set()
            for thread in holders:
                thread.join(30)
            assert held_serials[-2:] == [serials[-2]] * 2
        with keep_alive.stream("GET", f"{url}/") as response:
            assert _serial_of(response) == serials[0]  # same connection, old certificate
            response.read()
    finally:
        stop.set()
        app.release.set()
        keep_alive.close()
        for thread in hammers:
            thread.join(30)
    assert failures == []
    assert set(new_conn_serials) == set(serials)
    assert [c.serial_number for c in https_server.reloaded] == serials[1:]
    assert https_server.peer_serial(SERVICE_DNS) == serials[-1]

"""The e2e cluster's stand-in for Service networking (kube-proxy).

The API server calls a webhook Service at `<service>.<namespace>.svc:<port>`, verifying
the certificate for that name. Here no Service IP is routable, so the API server runs
with `HTTPS_PROXY` pointing at this HTTP CONNECT proxy, which tunnels each registered
`<host>:<port>` to a process on a loopback port. TLS stays end to end between the API
server and the webhook; the proxy only copies bytes. Unknown names get `403`, a
registered name whose process is down gets `502`, so the API server's error says so.
Both legs of a tunnel set `TCP_NODELAY`, as kube-proxy's packet forwarding adds no
Nagle delay: otherwise a response written as two TLS records waits for the peer's
delayed ACK (about 40 ms) and the latency measured is the proxy's.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        request = self.rfile.readline(8192).decode("latin-1").split()
        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass  # headers are not needed
        if len(request) != 3 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        port = self.server.routes.get(request[1])
        if port is None:
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        upstream.settimeout(None)
        for leg in (upstream, self.connection):
            leg.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        with upstream:
            back = threading.Thread(target=_pipe, args=(upstream, self.connection), daemon=True)
            back.start()
            _pipe(self.connection, upstream)
            back.join()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    routes: dict[str, int]


class ServiceProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 mapping `host:port` names to loopback ports."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.routes = {}
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="service-proxy"
        )

    def route(self, service: str, namespace: str, port: int, local_port: int) -> None:
        """Send `<service>.<namespace>.svc:<port>` to `127.0.0.1:<local_port>`."""
        self._server.routes[f"{service}.{namespace}.svc:{port}"] = local_port

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

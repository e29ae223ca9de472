"""Bounded HTTP connections for the webhook's and the console's uvicorn servers.

Contract:
- :func:`bounded_http` gives the ``http`` protocol class for a ``uvicorn.Config``: uvicorn's
  own (httptools, else h11) inside a wrapper that enforces :class:`ConnectionLimits`.
- ``max_connections``: a connection beyond that many open ones (in this process) is
  answered at once with ``503`` and ``Connection: close`` saying so, and closed a second
  later (what it sends meanwhile is discarded); it never reaches the app. A TLS
  connection counts once its handshake is done; :func:`handshake_timeout` ends a
  handshake that does not finish within ``request_seconds`` (instead of the event
  loop's 60 s), and bounds a TLS shutdown the same way (instead of 30 s).
- ``request_seconds``: a request must arrive whole (request line, headers and body) within
  that many seconds of its first byte, and a new connection must send its first request
  within that many seconds; otherwise the connection is closed. Idle time between
  requests is uvicorn's ``timeout_keep_alive``; a response being streamed (the console's
  event stream) is not limited.
- A refused or timed-out connection is closed at once, without waiting for a TLS
  client's close_notify: a client that never answers holds no descriptor and no place
  under the cap after its refusal or its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, cast

log = logging.getLogger("fairgate.connections")

DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_REQUEST_SECONDS = 10.0
_WARN_EVERY = 10.0
_LINGER = 1.0  # seconds a refused connection is read (and discarded) before closing


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections a server keeps open, and how long a request may take to
    arrive (see the module contract)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_seconds: float = DEFAULT_REQUEST_SECONDS

    def __post_init__(self) -> None:
        if self.max_connections < 1 or not self.request_seconds > 0:
            raise ValueError("max_connections must be 1 or more and request_seconds above 0")


DEFAULT_LIMITS = ConnectionLimits()
CONSOLE_LIMITS = ConnectionLimits(max_connections=512)


def _refusal(limit: int) -> bytes:
    body = (f"too many connections: this server keeps at most {limit} open; retry "
            "later\n").encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\nretry-after: 1\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class _BoundedHTTP(asyncio.Protocol):
    """uvicorn's HTTP protocol for one connection, within ``limits``."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    base: ClassVar[type[asyncio.Protocol]]
    _warned: ClassVar[float] = float("-inf")

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._inner: Any = self.base(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state=app_state, _loop=_loop)
        self._connections: set[Any] = server_state.connections
        self._loop = _loop or asyncio.get_event_loop()
        self._transport: asyncio.BaseTransport | None = None
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_after: object = None  # the request before the one awaited

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        limit = self.limits.max_connections
        if len(self._connections) >= limit:
            self._refused = True
            now = time.monotonic()
            if now - _BoundedHTTP._warned >= _WARN_EVERY:
                _BoundedHTTP._warned = now
                log.warning("refusing connections: %d open, the limit", limit)
            writer = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
            writer.write(_refusal(limit))
            if writer.can_write_eof():
                writer.write_eof()
            # Closed after a moment, not at once: closing with the client's request unread
            # would reset the connection, and the refusal with it. Aborted: a TLS close
            # would wait for the client's close_notify, keeping the descriptor meanwhile.
            self._loop.call_later(_LINGER, writer.abort)
            return
        self._inner.connection_made(transport)
        self._arm(None)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        cycle = self._inner.cycle
        if cycle is not None and cycle.response_complete and cycle is not self._waiting_after:
            self._arm(cycle)  # the first bytes of the next request on this connection
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._refused else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._inner.resume_writing()

    def _arm(self, after: object) -> None:
        self._disarm()
        self._waiting_after = after
        self._deadline = self._loop.call_later(self.limits.request_seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        cycle = self._inner.cycle
        if cycle is not None and cycle is not self._waiting_after and not cycle.more_body:
            return  # the awaited request arrived whole
        transport = cast(asyncio.Transport | None, self._transport)
        if transport is not None and not transport.is_closing():
            log.debug("closing a connection whose request did not arrive within %gs",
                      self.limits.request_seconds)
            transport.abort()  # no TLS close_notify awaited (see connection_made)


def bounded_http(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The ``http`` protocol class for a ``uvicorn.Config`` that enforces ``limits``."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # not for every CLI command

    return type("BoundedHTTP", (_BoundedHTTP,), {"limits": limits, "base": AutoHTTPProtocol})


@contextlib.contextmanager
def handshake_timeout(loop: asyncio.AbstractEventLoop, seconds: float) -> Iterator[None]:
    """While open, TLS servers that ``loop`` creates (uvicorn's, which pass ``ssl=`` and
    no handshake timeout) end a handshake not done within ``seconds``, and a TLS shutdown
    (the client's close_notify awaited) too."""
    create_server = loop.create_server

    async def with_timeout(*args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", seconds)
            kwargs.setdefault("ssl_shutdown_timeout", seconds)
        return await create_server(*args, **kwargs)

    setattr(loop, "create_server", with_timeout)  # noqa: B010 - this loop's servers only
    try:
        yield
    finally:
        delattr(loop, "create_server")

"""How every fairgate component reaches Redis: URL, password and TLS, resolved in one place.

Contract:
- :class:`RedisTarget` is what a command connects to: the URL (``redis://``, ``rediss://``
  for TLS, ``unix://``, or a Sentinel-managed primary: see :class:`SentinelAddress`), a
  password held apart from it, and the CA that must have signed a TLS server's
  certificate. :meth:`RedisTarget.resolve` builds it from the command line
  and the environment (see its docstring for the sources and their order).
- The password never leaves through text: ``str()`` / ``repr()`` of a target and
  :meth:`RedisTarget.display` show the URL with any password replaced by ``***``;
  :meth:`RedisTarget.scrub` does the same to any message (e.g. an exception's text)
  before it is printed, logged or audited.
- :func:`connect_redis` / :func:`connect_redis_async` are the only way fairgate's own code
  makes a Redis client (a plain URL string is accepted as a target without extras).
  Every call fails within about ``timeout`` seconds; a dropped connection is retried once
  at once (a restarted Redis) unless a ``retry`` is given. Over ``rediss://`` the server
  certificate must verify against the CA (``ca_file``, the URL's ``ssl_ca_certs``, or
  the system store) and name the host; TLS 1.2 is the minimum.
- A Sentinel target (``redis+sentinel://``, ``rediss+sentinel://`` for TLS to sentinels
  and Redis alike) makes one ``Sentinel`` and one ``master_for()`` client per call of
  :func:`connect_redis` / :func:`connect_redis_async` (redis-py builds a new pool on every
  ``master_for()``, redis-py #3433). Every new connection asks the sentinels for the
  current primary; a connection that meets a demoted primary (READONLY) is dropped, so
  the one retry goes to the new primary. The asyncio client (the webhook's) also asks
  the sentinels at most every :data:`PRIMARY_RECHECK_SECONDS` before taking a pooled
  connection, and drops pooled connections to a primary they no longer name: a pool
  full of connections to a frozen old primary would otherwise time out one by one. The
  password (and user) is the same for the sentinels and the Redis servers.
  :attr:`RedisTarget.replicated` is true for such a target: its writes are acknowledged
  only once a replica has them (``WAIT``).
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_REDIS_TIMEOUT = 0.5  # seconds: the webhook answers within its deadline
COMMAND_TIMEOUT = 10.0  # seconds: the one-shot commands (status, why, audit)
PASSWORD_ENV = "REDIS_PASSWORD"
REDACTED = "***"
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
SCHEMES = ("redis://", "rediss://", "unix://", *SENTINEL_SCHEMES)
SENTINEL_PORT = 26379  # a sentinel's port when the URL names none
ASYNC_MAX_CONNECTIONS = 1000  # the asyncio pool's bound (redis-py's default is 100)
PRIMARY_RECHECK_SECONDS = 0.5  # the asyncio client asks the sentinels this often at most
SENTINEL_FORM = "redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]"
_MASTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# What Redis answers a client that did not authenticate (or gave a wrong password).
_AUTH_REFUSED = re.compile(r"NOAUTH|WRONGPASS|HELLO must be called with the client already "
                           r"authenticated|Authentication required|invalid password")
# URL query parameters redis-py turns into connection arguments that are secrets.
_SECRET_QUERY_KEYS = frozenset({"password", "ssl_password"})


class RedisSettingsError(ValueError):
    """The Redis URL, password or CA given cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class SentinelAddress:
    """Where a Sentinel-managed primary is found: the parsed form of
    ``redis+sentinel://[user:password@]host[:port][,host[:port]...]/<master>[/db]``.

    A port left out is :data:`SENTINEL_PORT`; an IPv6 host is written in brackets
    (``[::1]:26379``); ``db`` defaults to 0. The URL takes no query parameters (the CA is
    ``--redis-ca-file``); ``rediss+sentinel://`` speaks TLS to sentinels and Redis.
    """

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    tls: bool = False
    username: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        """The address in ``url``; :class:`RedisSettingsError` saying what is wrong."""
        shown = redact_url(url)

        def bad(why: str) -> RedisSettingsError:
            return RedisSettingsError(f"{shown!r} is not a usable Sentinel URL: {why}; "
                                      f"use {SENTINEL_FORM}")

        scheme, _, rest = url.partition("://")
        if scheme not in ("redis+sentinel", "rediss+sentinel"):
            raise bad("the scheme must be redis+sentinel:// or rediss+sentinel://")
        if "?" in rest or "#" in rest:
            raise bad("it takes no query (?...) or fragment (#...); give the CA with "
                      "--redis-ca-file")
        netloc, slash, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        username = unquote(userinfo.partition(":")[0]) if at else ""
        if not hosts:
            raise bad("no sentinel host is given")
        sentinels = tuple(_sentinel_host(part, bad) for part in hosts.split(","))
        if len(set(sentinels)) != len(sentinels):
            raise bad("a sentinel is listed twice")
        names = path.split("/") if slash else []
        if not names or not names[0]:
            raise bad("the master name (the name the sentinels monitor, e.g. /fairgate) "
                      "is missing after the hosts")
        if not _MASTER_NAME.fullmatch(names[0]):
            raise bad(f"the master name {names[0]!r} may hold only letters, digits, '.', "
                      "'_' and '-'")
        if len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
            raise bad(f"{'/'.join(names[1:])!r} after the master name is not a database "
                      "number (e.g. /fairgate/0)")
        db = int(names[1]) if len(names) == 2 else 0
        return cls(sentinels, names[0], db, scheme == "rediss+sentinel", username or None)


def _sentinel_host(
    part: str, bad: Callable[[str], RedisSettingsError]
) -> tuple[str, int]:
    """``host[:port]`` or ``[v6]:port`` of one sentinel."""
    if part.startswith("["):
        host, bracket, port_text = part[1:].partition("]")
        if not bracket or (port_text and not port_text.startswith(":")):
            raise bad(f"the sentinel {part!r} is not [IPv6]:PORT")
        port_text = port_text[1:]
    else:
        host, _, port_text = part.partition(":")
    if not host:
        raise bad(f"a sentinel host is empty in {part!r} (check the commas)")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise bad(f"the sentinel {part!r} has no port number between 1 and 65535")
    return host, int(port_text)


def _replace_password(url: str, replacement: str | None) -> str:
    """``url`` with the password of its user info replaced (None: removed)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    if replacement is not None:
        netloc = f"{user}:{replacement}@{hostport}"
    else:
        netloc = f"{user}@{hostport}" if user else hostport
    return urlunsplit(parts._replace(netloc=netloc))


def redact_url(url: str) -> str:
    """``url`` with the password of its user info and secret query values as ``***``
    (a URL too broken to split, e.g. an unclosed ``[``, loses all its user info and
    query instead)."""
    try:
        parts = urlsplit(_replace_password(url, REDACTED))
    except ValueError:
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        host = netloc.rpartition("@")[2]
        return f"{scheme}://{REDACTED + '@' if '@' in netloc else ''}{host}{slash}" + \
            path.partition("?")[0]
    netloc = parts.netloc
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if k in _SECRET_QUERY_KEYS else v) for k, v in pairs],
                          safe="/*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_url(url: str) -> str:
    """``url`` if it is a Redis URL, else :class:`RedisSettingsError` (which shows it
    without its password)."""
    if not url.startswith(SCHEMES):
        raise RedisSettingsError(
            f"{redact_url(url)!r} is not a Redis URL: use redis://HOST:PORT/DB "
            f"(rediss:// for TLS, unix:///path/redis.sock, {SENTINEL_FORM} for Sentinel)"
        )
    if url.startswith(SENTINEL_SCHEMES):
        SentinelAddress.parse(url)
        return url
    try:
        urlsplit(url)
    except ValueError as exc:
        raise RedisSettingsError(f"{redact_url(url)!r} is not a usable Redis URL ({exc}): "
                                 "use redis://HOST:PORT/DB, [IPv6] in brackets") from None
    return url


def _read_password(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RedisSettingsError(
            f"cannot read the Redis password file {path}: {exc.__class__.__name__}: "
            f"{getattr(exc, 'strerror', None) or exc}; give a readable file holding only "
            "the password (--redis-password-file / $REDIS_PASSWORD_FILE)"
        ) from None
    password = text.rstrip("\r\n")
    if not password:
        raise RedisSettingsError(
            f"the Redis password file {path} is empty: write the password into it, or drop "
            "--redis-password-file to connect without one"
        )
    return password


@dataclass(frozen=True, repr=False)
class RedisTarget:
    """A Redis to connect to; its text forms never show the password."""

    url: str
    password: str | None = None
    ca_file: Path | None = None

    @classmethod
    def resolve(
        cls,
        url: str,
        *,
        password_file: Path | None = None,
        ca_file: Path | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> RedisTarget:
        """The target for ``url`` plus the password and CA given beside it.

        The password comes from, in order: ``password_file`` (its content without a final
        newline), the URL's user info (``redis://[user]:password@host``), then
        ``$REDIS_PASSWORD`` (an empty value counts as unset). A password both in the URL
        and in ``password_file`` is refused, as is a CA given both as ``ca_file`` and
        as the URL's ``ssl_ca_certs``; ``ca_file`` needs a ``rediss://`` URL.
        """
        parts = urlsplit(check_url(url))
        password: str | None = None
        if password_file is not None:
            if parts.password is not None:
                raise RedisSettingsError(
                    f"the Redis password is given twice, in the URL {redact_url(url)} and in "
                    f"--redis-password-file {password_file}: keep only one"
                )
            password = _read_password(password_file)
        elif parts.password is None:
            password = environ.get(PASSWORD_ENV) or None
        if ca_file is not None:
            if parts.scheme not in ("rediss", "rediss+sentinel"):
                raise RedisSettingsError(
                    f"--redis-ca-file {ca_file} is for TLS, but {redact_url(url)} is not a "
                    "rediss:// URL (nor rediss+sentinel://): use rediss://HOST:PORT/DB, or "
                    "drop --redis-ca-file"
                )
            if any(k == "ssl_ca_certs" for k, _ in parse_qsl(parts.query)):
                raise RedisSettingsError(
                    f"the Redis CA is given twice, as ssl_ca_certs in {redact_url(url)} and "
                    f"as --redis-ca-file {ca_file}: keep only one"
                )
            if not ca_file.is_file():
                raise RedisSettingsError(
                    f"--redis-ca-file {ca_file} is not a readable file: give the PEM file "
                    "of the CA that signed the Redis server's certificate"
                )
        return cls(url, password, ca_file)

    @classmethod
    def of(cls, target: RedisTarget | str) -> RedisTarget:
        """``target`` itself, or a plain URL as a target without password or CA."""
        return target if isinstance(target, RedisTarget) else cls(target)

    def apart(self) -> tuple[str, str | None]:
        """The URL without a password, and the password (from the URL or beside it):
        for handing the target to a child process without putting the password on its
        command line."""
        in_url = urlsplit(self.url).password
        password = self.password if in_url is None else unquote(in_url)
        return _replace_password(self.url, None), password

    @property
    def sentinel(self) -> SentinelAddress | None:
        """The Sentinel address of a ``redis+sentinel://`` target, else None."""
        if not self.url.startswith(SENTINEL_SCHEMES):
            return None
        return SentinelAddress.parse(self.url)

    @property
    def replicated(self) -> bool:
        """Whether writes must reach a replica before they count (a Sentinel target)."""
        return self.sentinel is not None

    @property
    def display(self) -> str:
        """The URL with any password as ``***``: safe to print and log."""
        return redact_url(self.url)

    def __str__(self) -> str:
        """:attr:`display`."""
        return self.display

    def __repr__(self) -> str:
        """The fields, the password only as whether there is one."""
        password = "None" if self.password is None else repr(REDACTED)
        return (f"RedisTarget(url={self.display!r}, password={password}, "
                f"ca_file={self.ca_file!r})")

    def scrub(self, text: str) -> str:
        """``text`` with the URL and every form of the password replaced (for messages
        built from exceptions or other text that might echo them)."""
        text = text.replace(self.url, self.display)
        parts = urlsplit(self.url)
        hidden = {self.password, parts.password}
        hidden |= {v for k, v in parse_qsl(parts.query) if k in _SECRET_QUERY_KEYS}
        for secret in sorted((h for h in hidden if h), key=len, reverse=True):
            for form in {secret, quote(secret, safe=""), unquote(secret)}:
                text = text.replace(form, REDACTED)
        return text

    def problem(self, exc: BaseException) -> str:
        """What went wrong reaching this Redis (``exc``, scrubbed) and what to check: for a
        Redis that wants a password none was given for, where to give it."""
        text = self.scrub(str(exc))
        if isinstance(exc, redis.AuthenticationError) or _AUTH_REFUSED.search(text):
            _url, password = self.apart()
            hint = (("it requires a password and none was given" if password is None
                     else "it refused the password") + ": give it with "
                    "--redis-password-file PATH, $" + PASSWORD_ENV
                    + " or redis://:PASSWORD@HOST in the URL")
        elif "CERTIFICATE_VERIFY_FAILED" in text:
            hint = ("the server's TLS certificate did not verify: give the CA that signed it "
                    "with --redis-ca-file / $REDIS_CA_FILE, and a host name it names")
        else:
            hint = "check --redis-url / $REDIS_URL"
        return f"cannot reach Redis at {self} ({text}): {hint}"

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for redis-py's ``from_url`` (password, TLS settings)."""
        options: dict[str, Any] = {}
        if self.password is not None:
            options["password"] = self.password
        if self.url.startswith(("rediss://", "rediss+sentinel://")):
            options["ssl_min_version"] = ssl.TLSVersion.TLSv1_2
            if self.ca_file is not None:
                options["ssl_ca_certs"] = str(self.ca_file)
        return options

    def sentinel_options(self, address: SentinelAddress) -> dict[str, Any]:
        """Connection arguments for the sentinels and the Redis servers of ``address``
        (the same user, password and TLS for both)."""
        options = self.client_options()
        password = self.apart()[1]
        if password is not None:
            options["password"] = password
        if address.username is not None:
            options["username"] = address.username
        if address.tls:
            options["ssl"] = True
        return options


def connect_redis(
    target: RedisTarget | str,
    timeout: float | None = DEFAULT_REDIS_TIMEOUT,
    *,
    retry: Retry | None = None,
) -> redis.Redis:
    """A Redis client for ``target`` whose every call fails within about ``timeout``
    seconds (None: no limit); see the module contract."""
    resolved = RedisTarget.of(target)
    retry = retry or Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    address = resolved.sentinel
    if address is not None:
        options = resolved.sentinel_options(address)
        sentinel = redis.sentinel.Sentinel(
            address.sentinels, sentinel_kwargs=_sentinel_kwargs(options, timeout),
            socket_timeout=timeout, socket_connect_timeout=timeout, **options)
        client: redis.Redis = sentinel.master_for(
            address.master, db=address.db, retry=retry)
        return client
    return redis.Redis.from_url(
        resolved.url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry,
        **resolved.client_options(),
    )


def _sentinel_kwargs(options: Mapping[str, Any], timeout: float | None) -> dict[str, Any]:
    """Connection arguments for the sentinels themselves: the servers' credentials and
    TLS, the same timeout, no retry (the next sentinel is the retry)."""
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, **options}


class _RecheckedPrimaryPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """A Sentinel pool that asks the sentinels which server is the primary at most every
    :data:`PRIMARY_RECHECK_SECONDS` when a connection is taken, and drops idle connections
    to a server they no longer name (redis-py only asks when it opens a connection)."""

    _next_check = 0.0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A pooled connection to the primary the sentinels named last."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + PRIMARY_RECHECK_SECONDS
            # Drops idle connections to an old primary; when no sentinel answers, the
            # primary named before stays in use.
            with contextlib.suppress(redis.ConnectionError):
                await self.get_master_address()  # type: ignore[no-untyped-call]
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self.master_address is not None and \
                (connection.host, connection.port) != self.master_address:
            try:
                await connection.disconnect()  # it reconnects to the primary named now
            except BaseException:
                await self.release(connection)
                raise
        return connection


def connect_redis_async(
    target: RedisTarget | str, timeout: float | None = DEFAULT_REDIS_TIMEOUT
) -> redis.asyncio.Redis:
    """As :func:`connect_redis`, for the event loop (the webhook's decisions), with a
    pool of up to :data:`ASYNC_MAX_CONNECTIONS` connections: a decision answered at the
    deadline keeps its connection until its Redis calls end or time out, so a slow or
    failing-over Redis needs more connections than there are requests in flight."""
    resolved = RedisTarget.of(target)
    retry = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    address = resolved.sentinel
    if address is not None:
        options = resolved.sentinel_options(address)
        sentinel = redis.asyncio.sentinel.Sentinel(
            address.sentinels,
            sentinel_kwargs={**_sentinel_kwargs(options, timeout),
                             "max_connections": ASYNC_MAX_CONNECTIONS},
            socket_timeout=timeout, socket_connect_timeout=timeout,
            max_connections=ASYNC_MAX_CONNECTIONS, **options)
        client: redis.asyncio.Redis = sentinel.master_for(
            address.master, connection_pool_class=_RecheckedPrimaryPool, db=address.db,
            retry=retry)
        return client
    return redis.asyncio.Redis.from_url(
        resolved.url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        max_connections=ASYNC_MAX_CONNECTIONS,
        retry=retry,
        **resolved.client_options(),
    )

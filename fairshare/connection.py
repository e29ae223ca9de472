"""How every fairgate component reaches Redis: URL, password and TLS, resolved in one place.

Contract:
- :class:`RedisTarget` is what a command connects to: the URL (``redis://``, ``rediss://``
  for TLS, ``unix://``), a password held apart from it, and the CA that must have signed a
  TLS server's certificate. :meth:`RedisTarget.resolve` builds it from the command line
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
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_REDIS_TIMEOUT = 0.5  # seconds: the webhook answers within its deadline
COMMAND_TIMEOUT = 10.0  # seconds: the one-shot commands (status, why, audit)
PASSWORD_ENV = "REDIS_PASSWORD"
REDACTED = "***"
SCHEMES = ("redis://", "rediss://", "unix://")
# URL query parameters redis-py turns into connection arguments that are secrets.
_SECRET_QUERY_KEYS = frozenset({"password", "ssl_password"})


class RedisSettingsError(ValueError):
    """The Redis URL, password or CA given cannot be used; the message says what to fix."""


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
    """``url`` with the password of its user info and secret query values as ``***``."""
    parts = urlsplit(_replace_password(url, REDACTED))
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
            "(rediss:// for TLS, unix:///path/redis.sock)"
        )
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
            if parts.scheme != "rediss":
                raise RedisSettingsError(
                    f"--redis-ca-file {ca_file} is for TLS, but {redact_url(url)} is not a "
                    "rediss:// URL: use rediss://HOST:PORT/DB, or drop --redis-ca-file"
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

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for redis-py's ``from_url`` (password, TLS settings)."""
        options: dict[str, Any] = {}
        if self.password is not None:
            options["password"] = self.password
        if self.url.startswith("rediss://"):
            options["ssl_min_version"] = ssl.TLSVersion.TLSv1_2
            if self.ca_file is not None:
                options["ssl_ca_certs"] = str(self.ca_file)
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
    return redis.Redis.from_url(
        resolved.url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry or Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **resolved.client_options(),
    )


def connect_redis_async(
    target: RedisTarget | str, timeout: float | None = DEFAULT_REDIS_TIMEOUT
) -> redis.asyncio.Redis:
    """As :func:`connect_redis`, for the event loop (the webhook's decisions)."""
    resolved = RedisTarget.of(target)
    return redis.asyncio.Redis.from_url(
        resolved.url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **resolved.client_options(),
    )

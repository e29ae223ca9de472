"""fairshare.connection: where the Redis password and CA come from, that no text form
shows the password, and that password and TLS verification hold against a real
redis-server (with a server certificate from the project's own ``certs`` module)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from certs import write_bundle
from fairshare.connection import (
    SENTINEL_PORT,
    RedisSettingsError,
    RedisTarget,
    SentinelAddress,
    connect_redis,
    connect_redis_async,
    redact_url,
)
from fairshare.localredis import local_redis

PASSWORD = "s3cr:t/p@ss word"  # every character that needs quoting in a URL
ENCODED = "s3cr%3At%2Fp%40ss%20word"


@pytest.fixture(scope="module")
def auth_redis() -> Iterator[str]:
    """A redis-server that requires PASSWORD; its URL (which holds no password)."""
    with local_redis(password=PASSWORD) as url:
        yield url


@pytest.fixture(scope="module")
def tls_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The TLS server's certificate directory (SAN 127.0.0.1 only) and an unrelated CA."""
    server = tmp_path_factory.mktemp("redis-tls")
    write_bundle(server, service="fairgate-redis", extra_sans=("127.0.0.1",))
    other = tmp_path_factory.mktemp("other-ca")
    write_bundle(other, service="fairgate-redis", extra_sans=("127.0.0.1",))
    return server, other


@pytest.fixture(scope="module")
def tls_redis(tls_dirs: tuple[Path, Path]) -> Iterator[str]:
    """A TLS-only redis-server that also requires PASSWORD; its rediss:// URL."""
    with local_redis(password=PASSWORD, tls_dir=tls_dirs[0]) as url:
        yield url


# -- where the password and CA come from --------------------------------------------------


def test_password_file_wins_and_loses_its_final_newline(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    target = RedisTarget.resolve("redis://h:6379/0", password_file=secret,
                                 environ={"REDIS_PASSWORD": "from-env"})
    assert target.password == PASSWORD


def test_environment_password_is_the_fallback() -> None:
    env = {"REDIS_PASSWORD": PASSWORD}
    assert RedisTarget.resolve("redis://h:6379/0", environ=env).password == PASSWORD
    # A password in the URL is more specific than the environment.
    in_url = RedisTarget.resolve(f"redis://:{ENCODED}@h:6379/0", environ=env)
    assert in_url.password is None and in_url.apart() == ("redis://h:6379/0", PASSWORD)
    # An empty variable (e.g. an optional Secret that is absent) means no password.
    assert RedisTarget.resolve("redis://h/0", environ={"REDIS_PASSWORD": ""}).password is None


def test_acl_user_in_the_url_keeps_its_name_and_takes_the_file_password(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    target = RedisTarget.resolve("redis://fairgate@h:6379/0", password_file=secret, environ={})
    assert target.apart() == ("redis://fairgate@h:6379/0", PASSWORD)


@pytest.mark.parametrize(("url", "password_file", "ca_file", "says"), [
    ("http://u:hunter2@h/0", None, None, "is not a Redis URL"),
    ("redis://:hunter2@[::1/0", None, None, "is not a usable Redis URL"),
    ("redis://:hunter2@h/0", "password", None, "given twice"),
    ("redis://h/0", "missing", None, "cannot read the Redis password file"),
    ("redis://h/0", "empty", None, "is empty"),
    ("redis://:hunter2@h/0", None, "ca.crt", "not a rediss:// URL"),
    ("rediss://:hunter2@h/0?ssl_ca_certs=/x.pem", None, "ca.crt", "CA is given twice"),
    ("rediss://:hunter2@h/0", None, "missing.crt", "not a readable file"),
])
def test_unusable_settings_say_what_to_fix_without_the_password(
    tmp_path: Path, url: str, password_file: str | None, ca_file: str | None, says: str
) -> None:
    (tmp_path / "password").write_text("hunter2\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(RedisSettingsError) as error:
        RedisTarget.resolve(
            url,
            password_file=tmp_path / password_file if password_file else None,
            ca_file=tmp_path / ca_file if ca_file else None,
            environ={},
        )
    assert says in str(error.value)
    assert "hunter2" not in str(error.value)


# -- Sentinel URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "address"), [
    ("redis+sentinel://s1:26379,s2:26380,s3/fairgate",
     SentinelAddress((("s1", 26379), ("s2", 26380), ("s3", SENTINEL_PORT)), "fairgate")),
    ("redis+sentinel://s1/fairgate/3", SentinelAddress((("s1", SENTINEL_PORT),), "fairgate", 3)),
    ("rediss+sentinel://fairgate:hunter2@s1:1,[::1]:2/my-master.0/0",
     SentinelAddress((("s1", 1), ("::1", 2)), "my-master.0", 0, True, "fairgate")),
    ("redis+sentinel://:hunter2@[fd00::1]/m",
     SentinelAddress((("fd00::1", SENTINEL_PORT),), "m")),
])
def test_sentinel_urls_parse(url: str, address: SentinelAddress) -> None:
    target = RedisTarget.resolve(url, environ={})
    assert target.sentinel == address and target.replicated
    assert not RedisTarget.resolve("redis://h:6379/0", environ={}).replicated


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///fairgate", "no sentinel host is given"),
    ("redis+sentinel://:hunter2@/fairgate", "no sentinel host is given"),
    ("redis+sentinel://s1:26379", "the master name"),
    ("redis+sentinel://s1:26379/", "the master name"),
    ("redis+sentinel://s1,,s2/fairgate", "a sentinel host is empty"),
    ("redis+sentinel://s1:http/fairgate", "no port number between 1 and 65535"),
    ("redis+sentinel://s1:0/fairgate", "no port number between 1 and 65535"),
    ("redis+sentinel://s1:65536/fairgate", "no port number between 1 and 65535"),
    ("redis+sentinel://[::1/fairgate", "is not [IPv6]:PORT"),
    ("redis+sentinel://s1,s1:26379/fairgate", "listed twice"),
    ("redis+sentinel://s1/fair gate", "may hold only letters"),
    ("redis+sentinel://s1/fairgate/x", "is not a database number"),
    ("redis+sentinel://s1/fairgate/0/1", "is not a database number"),
    ("redis+sentinel://s1/fairgate?ssl_ca_certs=/x.pem", "takes no query"),
    ("redis-sentinel://:hunter2@s1/fairgate", "is not a Redis URL"),
])
def test_malformed_sentinel_urls_say_what_to_fix_without_the_password(
    url: str, says: str
) -> None:
    with pytest.raises(RedisSettingsError) as error:
        RedisTarget.resolve(url.replace("://", "://:hunter2@", 1)
                            if "@" not in url and "+" in url else url, environ={})
    assert says in str(error.value)
    assert "hunter2" not in str(error.value)
    assert "redis+sentinel://" in str(error.value)  # shows the form to use


def test_sentinel_url_takes_the_ca_file_only_over_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    tls = RedisTarget.resolve("rediss+sentinel://s1/fairgate", ca_file=ca, environ={})
    assert tls.ca_file == ca and tls.sentinel is not None and tls.sentinel.tls
    with pytest.raises(RedisSettingsError, match="not a rediss://"):
        RedisTarget.resolve("redis+sentinel://s1/fairgate", ca_file=ca, environ={})


def test_sentinel_target_hides_its_password_and_hands_it_apart() -> None:
    url = f"redis+sentinel://fairgate:{ENCODED}@s1:26379,s2:26379/fairgate/0"
    target = RedisTarget.resolve(url, environ={})
    for shown in (str(target), repr(target), target.scrub(f"boom {url} {PASSWORD}")):
        assert PASSWORD not in shown and ENCODED not in shown
        assert "s1:26379,s2:26379/fairgate/0" in shown
    assert target.apart() == ("redis+sentinel://fairgate@s1:26379,s2:26379/fairgate/0",
                              PASSWORD)


# -- the password never shows --------------------------------------------------------------


@pytest.mark.parametrize("url", [
    f"redis://:{ENCODED}@fairgate-redis:6379/0",
    f"rediss://fairgate:{ENCODED}@fairgate-redis:6379/0?ssl_cert_reqs=required",
    f"redis://fairgate-redis:6379/0?password={ENCODED}",
])
def test_no_text_form_of_a_target_shows_the_password(url: str) -> None:
    target = RedisTarget(url, password=None)
    beside = RedisTarget("redis://fairgate-redis:6379/0", password=PASSWORD)
    for shown in (str(target), repr(target), target.display, redact_url(url),
                  str(beside), repr(beside)):
        assert PASSWORD not in shown and ENCODED not in shown
        assert "fairgate-redis:6379" in shown
    message = f"boom connecting to {url} with {PASSWORD} ({ENCODED})"
    for scrubbed in (target.scrub(message), beside.scrub(message)):
        assert PASSWORD not in scrubbed and ENCODED not in scrubbed
    assert "***" in target.scrub(message) and "fairgate-redis" in beside.scrub(message)


# -- against a real redis-server ---------------------------------------------------------


def test_the_password_opens_redis_and_nothing_else_does(auth_redis: str) -> None:
    client = connect_redis(RedisTarget(auth_redis, PASSWORD))
    assert client.set("fairgate:probe", "1") and client.get("fairgate:probe") == b"1"
    client.close()
    for target in (RedisTarget(auth_redis), RedisTarget(auth_redis, "wrong")):
        stranger = connect_redis(target)
        with pytest.raises(redis.AuthenticationError):
            stranger.get("fairgate:probe")
        stranger.close()
    # The password in the URL keeps working (percent-encoded, as URLs require).
    in_url = connect_redis(auth_redis.replace("redis://", f"redis://:{ENCODED}@"))
    assert in_url.get("fairgate:probe") == b"1"
    in_url.close()


def test_the_async_client_authenticates_the_same_way(auth_redis: str) -> None:
    async def probe(target: RedisTarget) -> object:
        client = connect_redis_async(target)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    assert asyncio.run(probe(RedisTarget(auth_redis, PASSWORD))) is True
    with pytest.raises(redis.AuthenticationError):
        asyncio.run(probe(RedisTarget(auth_redis, "wrong")))


def test_tls_with_the_ca_file_verifies_the_server(
    tls_redis: str, tls_dirs: tuple[Path, Path]
) -> None:
    target = RedisTarget.resolve(tls_redis, ca_file=tls_dirs[0] / "ca.crt",
                                 environ={"REDIS_PASSWORD": PASSWORD})
    client = connect_redis(target, timeout=5.0)  # TLS handshakes on a busy machine
    assert client.set("fairgate:tls", "yes") and client.get("fairgate:tls") == b"yes"
    client.close()

    async def async_ping() -> object:
        client = connect_redis_async(target, timeout=5.0)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    assert asyncio.run(async_ping()) is True
    # The URL form of the CA works too.
    query = connect_redis(RedisTarget(f"{tls_redis}?ssl_ca_certs={tls_dirs[0] / 'ca.crt'}",
                                      PASSWORD), timeout=5.0)
    assert query.get("fairgate:tls") == b"yes"
    query.close()


@pytest.mark.parametrize("case", ["system CAs", "another CA", "wrong host name", "plain text"])
def test_tls_refuses_a_server_whose_certificate_does_not_verify(
    tls_redis: str, tls_dirs: tuple[Path, Path], case: str
) -> None:
    server_dir, other_dir = tls_dirs
    url, ca = {
        "system CAs": (tls_redis, None),
        "another CA": (tls_redis, other_dir / "ca.crt"),
        # The certificate names 127.0.0.1 and the Service, not "localhost".
        "wrong host name": (tls_redis.replace("127.0.0.1", "localhost"), server_dir / "ca.crt"),
        # A TLS-only server does not answer plain text.
        "plain text": (tls_redis.replace("rediss://", "redis://"), None),
    }[case]
    client = connect_redis(RedisTarget(url, PASSWORD, ca), timeout=2.0)
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)) as error:
        client.ping()
    client.close()
    if case != "plain text":
        assert "certificate verify failed" in str(error.value).lower() or \
            "hostname" in str(error.value).lower()
    assert PASSWORD not in str(error.value)

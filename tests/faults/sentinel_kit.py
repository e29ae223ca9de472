"""A Redis Sentinel deployment on loopback for the HA fault tests: 3 ``redis-server`` (one
primary, two replicas) and 3 sentinels (``redis-server --sentinel``), real processes the
tests kill, freeze (SIGSTOP) and resume.

Settings are those of ``overlays/ha`` with the failover made faster: a node is
down after :data:`DOWN_AFTER_MS` without an answer, quorum 2, every server refuses writes
without one replica within :data:`MAX_LAG_S` (``min-replicas-to-write 1``). No
persistence: a killed node comes back empty and resyncs as a replica.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from fairshare.localredis import free_port

MASTER = "fairgate"
PASSWORD = "ha-s3cret"
# A sentinel that switches to a promoted replica opens its link to it only when its 1 s
# reconnect period allows (it was retrying the dead primary), yet counts the new primary
# down when no PONG came within down-after-milliseconds of the switch. At 1000 ms that
# left no slack: on the loaded 2-core machine the first PONG came 0-1.35 s after the switch
# (median 0.8 s); in 6 of 48 runs two sentinels judged the new primary down and failed
# over a second time, promoting its only replica: both servers refused writes
# (NOREPLICAS) past failover + 2 s. The overlay uses 5000 ms.
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 3000
MAX_LAG_S = 2


@dataclass
class Node:
    """One process (a Redis server or a sentinel) on a loopback port."""

    port: int
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (again, on the same port)."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A direct client (no Sentinel)."""
        return redis.Redis(host="127.0.0.1", port=self.port, password=PASSWORD,
                           socket_timeout=timeout, socket_connect_timeout=timeout)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` if running."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Until the process answers PING."""
        deadline = time.monotonic() + timeout
        client = self.client(0.5)
        try:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"{self.command[0]} on port {self.port} did not start: "
                           + self.log.read_text(errors="replace")[-2000:])


@dataclass
class SentinelCluster:
    """Three Redis servers and three sentinels monitoring them as :data:`MASTER`."""

    workdir: Path
    servers: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    promoted_port: int | None = None  # the primary the last wait_failover() found

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:p1,...,127.0.0.1:p3/fairgate/0`` (no password)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def _server(self, index: int, port: int, primary: int | None) -> Node:
        command = [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir),
            "--requirepass", PASSWORD, "--masterauth", PASSWORD,
            "--min-replicas-to-write", "1", "--min-replicas-max-lag", str(MAX_LAG_S),
            "--repl-ping-replica-period", "1", "--repl-timeout", "5",
            "--enable-debug-command", "local",
        ]
        if primary is not None:
            command += ["--replicaof", "127.0.0.1", str(primary)]
        return Node(port, command, self.workdir / f"redis-{index}.log")

    def start(self) -> None:
        """Start all six processes; return once every sentinel sees 2 replicas and the
        2 other sentinels."""
        ports = [free_port() for _ in range(3)]
        self.servers = [self._server(i, port, None if i == 0 else ports[0])
                        for i, port in enumerate(ports)]
        for server in self.servers:
            server.start()
        for server in self.servers:
            server.wait_ready()
        for i in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"requirepass {PASSWORD}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {ports[0]} 2\n"
                f"sentinel auth-pass {MASTER} {PASSWORD}\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 2\n"
            )
            self.sentinels.append(Node(port, ["redis-server", str(conf), "--sentinel"],
                                       self.workdir / f"sentinel-{i}.log"))
        for sentinel in self.sentinels:
            sentinel.start()
        for sentinel in self.sentinels:
            sentinel.wait_ready()
        self.wait_settled()

    def stop(self) -> None:
        """Kill every process."""
        for node in [*self.sentinels, *self.servers]:
            node.kill()

    def primary_port(self) -> int:
        """The primary's port, as the first sentinel that answers says."""
        for sentinel in self.sentinels:
            client = sentinel.client(0.5)
            try:
                return _named_port(client)
            except (redis.RedisError, TypeError):
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel answers")

    def primary(self) -> Node:
        """The server the sentinels name as primary."""
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def replicas(self) -> list[Node]:
        """The servers that are not the primary."""
        port = self.primary_port()
        return [s for s in self.servers if s.port != port]

    def wait_failover(self, old_port: int, timeout: float = 20.0) -> float:
        """Until every live sentinel names a primary other than ``old_port`` that answers
        as a primary with a linked replica (before that it refuses writes:
        ``min-replicas-to-write 1``); the ``time.monotonic()`` when that was first seen:
        the end of the failover. Its port is kept as :attr:`promoted_port`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = set()
            for sentinel in self.sentinels:
                client = sentinel.client(0.3)
                try:
                    ports.add(_named_port(client))
                except (redis.RedisError, TypeError):
                    ports.add(old_port)
                finally:
                    client.close()
            if len(ports) == 1 and old_port not in ports:
                new = next(s for s in self.servers if s.port in ports)
                client = new.client(0.3)
                try:
                    info = client.info("replication")
                    if info["role"] == "master" and any(
                            isinstance(v, dict) and v.get("state") == "online"
                            for k, v in info.items() if k.startswith("slave")):
                        self.promoted_port = new.port
                        return time.monotonic()
                except redis.RedisError:
                    pass
                finally:
                    client.close()
            time.sleep(0.05)
        raise AssertionError(f"no failover away from port {old_port} within {timeout}s")

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Until every sentinel agrees on one primary and sees 2 live, linked replicas
        and 2 other sentinels (a freshly started or just failed-over deployment).
        Sentinels learn replicas from the primary's INFO every 10 s: in one CI run on a
        loaded machine they still saw 1 of 2 after 30 s."""
        deadline = time.monotonic() + timeout
        state: object = None
        while time.monotonic() < deadline:
            try:
                state = [self._sentinel_view(s) for s in self.sentinels]
                ports = {view[0] for view in state}
                if len(ports) == 1 and all(v[1:] == (2, 2) for v in state):
                    primary = next(s for s in self.servers if s.port in ports)
                    client = primary.client(0.5)
                    try:
                        info = client.info("replication")
                    finally:
                        client.close()
                    if info["role"] == "master" and info["connected_slaves"] == 2:
                        return
            except (redis.RedisError, StopIteration) as exc:
                state = exc
            time.sleep(0.1)
        raise AssertionError(f"sentinels did not settle within {timeout}s: {state}")

    @staticmethod
    def _sentinel_view(sentinel: Node) -> tuple[int, int, int]:
        """(primary port, live replicas, other sentinels) as ``sentinel`` sees them."""
        client = sentinel.client(0.5)
        try:
            master = client.sentinel_master(MASTER)
            replicas = client.sentinel_slaves(MASTER)
        finally:
            client.close()
        live = sum(1 for r in replicas if not r["is_sdown"] and
                   r.get("master-link-status") == "ok")
        assert isinstance(master, dict)
        return int(master["port"]), live, int(master["num-other-sentinels"])


def _named_port(sentinel: redis.Redis) -> int:
    """The primary's port as ``sentinel`` names it (TypeError when it names none)."""
    _host, port = sentinel.execute_command(  # type: ignore[no-untyped-call]
        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
    return int(port)


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A fresh 3 + 3 Sentinel deployment of this test only."""
    workdir = tmp_path / "ha"
    workdir.mkdir()
    cluster = SentinelCluster(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

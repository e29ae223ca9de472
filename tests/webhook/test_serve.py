"""``fairgate serve`` over its lifetime: config and certificate hot reload, graceful stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from webhook_helpers import ServerFactory, gpu_pod, review

from audit import AuditLog, AuditRecord
from certs import write_bundle
from fairshare.localredis import free_port
from webhook.process import ServeProcess, client_context


def _decision(server: ServeProcess, namespace: str, name: str, dry_run: bool = False) -> str:
    with server.client() as client:
        reply = client.post("/mutate", json=review(gpu_pod(namespace, name), dry_run=dry_run))
    assert reply.status_code == 200
    response: dict[str, Any] = reply.json()["response"]
    return str(response["auditAnnotations"]["decision"])


def _eventually(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_quota_edit_takes_effect_without_a_restart(
    start_server: ServerFactory, redis_url: str
) -> None:
    server = start_server(redis_url)
    assert _decision(server, "team-b-dev", "one") == "admit"
    # nominal is 1 GPU: a second pod would wait (asked as a dry run: nothing is queued)
    assert _decision(server, "team-b-dev", "two", dry_run=True) == "queue"
    (server.config_dir / "quota-team-b.yaml").write_text("nominal: {gpu: 3}\n")
    assert _eventually(lambda: _decision(server, "team-b-dev", "two", dry_run=True) == "admit")
    assert _decision(server, "team-b-dev", "two") == "admit"


def test_children_start_whatever_directories_the_working_directory_holds(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fairgate serve`` (the demo's child) and its ConfigMap worker start from the
    installed packages: the working directory is not on their import path, so a
    ``./certs`` written by ``fairgate certs generate --out ./certs`` or a user's own
    packages named like fairgate's hide nothing."""
    work = tmp_path / "work"
    write_bundle(work / "certs", extra_sans=("127.0.0.1",))
    for package in ("audit", "tenants", "webhook", "fairshare"):
        (work / package).mkdir()
        (work / package / "__init__.py").write_text("raise ImportError('the wrong one')\n")
    monkeypatch.chdir(work)
    server = start_server(redis_url, cert_dir=Path("certs"))
    assert _decision(server, "team-b-dev", "one") == "admit"


def test_a_broken_config_edit_keeps_the_last_good_one_and_is_reported(
    start_server: ServerFactory, redis_url: str
) -> None:
    """The refused edit is reported where only operators look (the log), and /readyz
    says in general terms that some object was refused, without naming it."""
    server = start_server(redis_url)
    (server.config_dir / "quota-team-b.yaml").write_text("nominal: {gpu: [\n")

    def reported() -> bool:
        with server.client() as client:
            body = client.get("/readyz").json()
        return "config_edits" in body

    assert _eventually(reported)
    with server.client() as client:
        ready = client.get("/readyz")
    assert ready.status_code == 200  # the last good config still serves
    assert "team-b" not in ready.text
    assert "quota-team-b.yaml" in server.log_path.read_text()
    assert _decision(server, "team-b-dev", "still-works") == "admit"


def test_readyz_tells_an_unauthenticated_caller_nothing_about_an_invalid_quota(
    start_server: ServerFactory, redis_url: str
) -> None:
    """An invalid quota (nominal over its tenant's ceiling) leaves no tenant name, number
    or message in /readyz, ready or not; its detail is in the webhook's log."""
    server = start_server(redis_url)
    (server.config_dir / "quota-team-b.yaml").write_text(
        "nominal: {gpu: 777}\ndefaultClass: training\n")
    assert _eventually(lambda: "777" in server.log_path.read_text())
    with httpx.Client(base_url=server.base_url, timeout=10,
                      verify=client_context(server.cert_dir / "ca.crt")) as anonymous:
        ready = anonymous.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True and body["config"] == "loaded"
    assert "config_edits" in body
    for secret in ("team-b", "777", "ceiling", "quota", "nominal", "gpu", "yaml"):
        assert secret not in ready.text.lower(), (secret, ready.text)
    (server.config_dir / "platform.yaml").write_text("tenants: [\n")  # nothing loads now
    assert _eventually(lambda: "platform.yaml" in server.log_path.read_text())
    with server.client() as client:
        text = client.get("/readyz").text.lower()
    for secret in ("team-b", "777", "ceiling", "quota", "nominal", "yaml"):
        assert secret not in text, (secret, text)


def test_metrics_name_no_tenant_unless_the_operator_says_so(
    start_server: ServerFactory, redis_url: str
) -> None:
    """/metrics is on the port every source may reach: by default it counts decisions
    by verdict only, and no tenant or namespace name appears in it; with
    --metrics-tenant-labels names, decisions are counted by tenant."""
    hidden = start_server(redis_url)
    named = start_server(redis_url, extra=("--metrics-tenant-labels", "names"))
    texts = []
    for server in (hidden, named):
        assert _decision(server, "team-a-dev", "metrics-0") in ("admit", "queue")
        assert _decision(server, "team-b-dev", "metrics-1") in ("admit", "queue")
        with httpx.Client(base_url=server.base_url, timeout=10,
                          verify=client_context(server.cert_dir / "ca.crt")) as anonymous:
            reply = anonymous.get("/metrics")
        assert reply.status_code == 200
        texts.append(reply.text)
    hidden_text, named_text = texts
    for name in ("team-a", "team-b", "race", "tenant="):
        assert name not in hidden_text, name
    decided = [line for line in hidden_text.splitlines()
               if line.startswith("fairgate_admission_decisions_total{")]
    assert sum(float(line.split()[-1]) for line in decided) == 2, decided
    assert 'tenant="team-a"' in named_text and 'tenant="team-b"' in named_text


def test_a_file_edit_is_audited_as_quota_change_and_logged_while_a_broken_one_waits(
    start_server: ServerFactory, redis_url: str
) -> None:
    """team-a's broken file does not hold back team-b's edit; the edit is in the chained
    audit log as a ConfigMap edit would be, and the reload is one structured log line."""
    server = start_server(redis_url)
    (server.config_dir / "quota-team-a.yaml").write_text("nominal: {gpu: [\n")
    (server.config_dir / "quota-team-b.yaml").write_text("nominal: {gpu: 3}\n"
                                                          "defaultClass: training\n")
    assert _eventually(lambda: _decision(server, "team-b-dev", "x", dry_run=True) == "admit"
                       and _decision(server, "team-b-dev", "y", dry_run=True) == "admit")
    audit = AuditLog(redis.Redis.from_url(redis_url))

    def changes() -> list[AuditRecord]:
        return [e.record for e in audit.entries()
                if e.record is not None and e.record.decision == "quota-change"]

    assert _eventually(lambda: len(changes()) == 1)
    (change,) = changes()
    assert (change.name, change.namespace, change.tenant, change.operation) == (
        "quota-team-b", "", "team-b", "UPDATE")
    assert change.diff == {"nominal.gpu": {"before": 1, "after": 3}}
    assert "quota-team-b.yaml" in change.reason
    assert audit.verify()[0].ok
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines()
             if '"config-reload"' in line]
    assert [(line["changed"], line["kept"]) for line in lines] == [
        (["quota-team-b.yaml"], ["quota-team-a.yaml"])]


def test_a_renewed_certificate_is_served_without_a_restart(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, cert_dir: Path
) -> None:
    own_certs = tmp_path / "own-certs"
    write_bundle(own_certs, extra_sans=("127.0.0.1",))
    server = start_server(redis_url, cert_dir=own_certs)
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes((own_certs / "ca.crt").read_bytes())
    write_bundle(own_certs, extra_sans=("127.0.0.1",))  # a new CA and serving cert

    def new_cert_served() -> bool:
        try:
            with httpx.Client(verify=client_context(own_certs / "ca.crt")) as client:
                return client.get(f"{server.base_url}/healthz").status_code == 200
        except httpx.ConnectError:
            return False

    assert _eventually(new_cert_served)
    with httpx.Client(verify=client_context(old_ca)) as client, \
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(f"{server.base_url}/healthz")


def test_sigterm_finishes_requests_in_flight_and_exits_0(
    start_server: ServerFactory, redis_url: str
) -> None:
    server = start_server(redis_url)
    answers: list[int] = []

    def hammer() -> None:
        with server.client() as client:
            for i in range(200):
                try:
                    reply = client.post("/mutate", json=review(gpu_pod("team-a-dev", f"p{i}")))
                except httpx.TransportError:
                    return  # the server stopped accepting: fine, nothing half-answered
                answers.append(reply.status_code)

    worker = threading.Thread(target=hammer)
    worker.start()
    time.sleep(0.3)
    assert server.stop() == 0
    worker.join(30)
    assert answers and set(answers) == {200}
    assert "Finished server process" in server.log_tail(200)


def test_the_webhook_keeps_the_capacity_the_dispatcher_stored(
    start_server: ServerFactory, redis_url: str, redis_client: Any
) -> None:
    """In a cluster only the dispatcher knows the nodes' capacity: the webhook syncing
    its config must not wipe it (the pod would wait for capacity that exists)."""
    from fairshare.queue.fairqueue import FairQueue
    from tenants.localdir import load_config_dir

    server = start_server(redis_url, capacity=False)
    FairQueue(redis_client).sync_config(load_config_dir(server.config_dir), {"gpu": 8})
    assert _decision(server, "team-a-dev", "fits") == "admit"
    (server.config_dir / "quota-team-a.yaml").write_text(
        "nominal: {gpu: 3}\ndefaultClass: training\n")  # the webhook syncs again
    assert _eventually(lambda: _decision(server, "team-a-dev", "probe", dry_run=True) == "admit"
                       and _decision(server, "team-a-dev", "third", dry_run=True) == "admit")
    assert redis_client.hgetall("fairgate:cap") == {b"gpu": b"8"}


def _redis_server(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    assert _eventually(lambda: _pings(client)), "redis-server did not start"
    client.close()
    return process


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_service_recovers_when_redis_comes_back_empty(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    port = free_port()
    first = _redis_server(port, tmp_path)
    try:
        server = start_server(f"redis://127.0.0.1:{port}/0")
        assert _decision(server, "team-a-dev", "before") == "admit"
    finally:
        first.terminate()
        first.wait()
    assert _decision(server, "team-a-dev", "while-down") == "deny"
    second = _redis_server(port, tmp_path)  # restarted empty: no config, no usage
    try:
        # the webhook re-syncs its config into the empty Redis by itself, within 5 s
        assert _eventually(lambda: _decision(server, "team-a-dev", "after") == "admit",
                           timeout=5.0)
    finally:
        second.terminate()
        second.wait()


def _workers(pid: int) -> list[int]:
    """The worker processes of ``fairgate serve`` ``pid`` (not multiprocessing's helpers)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    children = [int(p) for p in path.read_text().split()] if path.exists() else []
    found = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(child)
    return found


def test_workers_share_the_port_replace_a_dead_one_and_stop_cleanly(
    cert_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    from webhook_helpers import write_config

    server = ServeProcess(cert_dir, redis_url, write_config(tmp_path / "config"),
                          tmp_path / "serve.log", workers=2)
    with server:
        assert server.process is not None
        parent = server.process.pid
        assert _eventually(lambda: len(_workers(parent)) == 2)
        decisions = [_decision(server, "race-dev", f"w{i}") for i in range(8)]
        assert decisions.count("admit") == 6  # one queue, whichever worker answered
        victim = _workers(parent)[0]
        os.kill(victim, signal.SIGKILL)
        assert _eventually(lambda: victim not in _workers(parent) and len(_workers(parent)) == 2)
        assert _eventually(lambda: _decision(server, "team-a-dev", "after") == "admit")
        assert server.stop() == 0
    assert "starting a new one" in server.log_tail(200)


def test_waiting_for_rebuild_keeps_quota_safe_across_a_redis_restart(
    cert_dir: Path, tmp_path: Path
) -> None:
    """With --wait-for-rebuild nothing is reserved on a Redis
    the reconciler has not rebuilt: after Redis restarts empty, a tenant whose pods still
    run cannot exceed its quota; once usage is rebuilt, the fast path is back."""
    from webhook_helpers import write_config

    from fairshare.queue.fairqueue import FairQueue

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    first = _redis_server(port, tmp_path)
    server = ServeProcess(cert_dir, url, write_config(tmp_path / "config"),
                          tmp_path / "serve.log", wait_for_rebuild=True)
    second: subprocess.Popen[bytes] | None = None
    try:
        with server:
            client = redis.Redis.from_url(url)
            assert _decision(server, "team-b-dev", "fresh") == "queue"  # never rebuilt
            FairQueue(client).rebuild([], [])  # the reconciler: the cluster runs nothing
            assert _decision(server, "team-b-dev", "runs") == "admit"  # team-b: 1 GPU
            first.terminate()
            first.wait()
            second = _redis_server(port, tmp_path)  # empty: "runs" is forgotten
            with server.client() as http:
                reply = http.post("/mutate", json=review(gpu_pod("team-b-dev", "after")))
            response = reply.json()["response"]
            assert response["auditAnnotations"]["decision"] == "queue"
            assert any("restore usage" in w for w in response["warnings"])
            client.close()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait()

"""``fairgate console`` against a real stack: Redis, ``fairgate serve`` over HTTPS, real
AdmissionReviews; pages checked over HTTP and in headless Chromium."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from axe_selenium_python import Axe
from console_helpers import ConsoleProcess, browser
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from webhook_helpers import gpu_pod, review, write_config

from audit import STREAM, AuditLog
from audit.chain import format_time
from audit.usage import start_detail
from certs import write_bundle
from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.status import why_command
from tenants.localdir import load_config_dir
from webhook.console.access import COOKIE, TokenAccess, Viewer
from webhook.console.data import ConsoleData
from webhook.console.events import Broadcaster
from webhook.console.history import FairnessHistory
from webhook.console.namespaces import NamespaceIndex
from webhook.process import ServeProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _post(server: ServeProcess, namespace: str, name: str) -> dict[str, Any]:
    """Send the pod's CREATE review; then, when it was allowed, confirm its ticket as the
    dispatcher does when it sees the pod (so its reservation or queue entry does not
    expire while the module runs)."""
    ticket = str(uuid.uuid4())
    with server.client() as client:
        answer = client.post("/mutate", json=review(gpu_pod(namespace, name), uid=ticket))
    answer.raise_for_status()
    response: dict[str, Any] = answer.json()["response"]
    if response["allowed"]:
        client = redis.Redis.from_url(server.redis.url)
        assert FairQueue(client).confirm(ticket, str(uuid.uuid4()), namespace, name) == \
            "confirmed"
        client.close()
    return response


@pytest.fixture(scope="module")
def stack(shared_server: ServeProcess, redis_server_url: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    """team-a runs 2 GPUs; team-b runs 1 and queues b-1, b-2 (nominal 1); a pod in the
    unlabeled namespace is denied; the console samples fairness every second."""
    client = redis.Redis.from_url(redis_server_url)
    client.flushall()
    client.close()
    for name in ("a-0", "a-1"):
        assert _post(shared_server, "team-a-dev", name)["allowed"]
    for name in ("b-0", "b-1", "b-2"):
        assert _post(shared_server, "team-b-dev", name)["allowed"]
    assert not _post(shared_server, "sandbox", "s-0")["allowed"]
    # the webhook appends audit records after it answers: wait for all six decisions
    client = redis.Redis.from_url(redis_server_url)
    deadline = time.monotonic() + 10
    while client.xlen(STREAM) < 6:
        assert time.monotonic() < deadline, "the webhook's 6 audit records never arrived"
        time.sleep(0.05)
    client.close()
    log = tmp_path_factory.mktemp("console") / "console.log"
    with ConsoleProcess(redis_server_url, shared_server.config_dir, log,
                        "--sample-every", "1") as console:
        yield console


def _get(console: ConsoleProcess, path: str, **params: str) -> httpx.Response:
    with console.client() as client:
        return client.get(path, params=params)


# -- access ------------------------------------------------------------------------------


def test_first_line_is_the_url_and_every_route_needs_its_token(
        stack: ConsoleProcess) -> None:
    assert re.fullmatch(r"console: http://127\.0\.0\.1:\d+/\?token=[\w-]{32}", stack.first_line)
    for path in ("/", "/tenants", "/queue", "/fairness", "/audit", "/cost", "/api/tenants",
                 "/api/queue", "/api/fairness", "/api/audit", "/api/cost", "/api/events",
                 "/static/console.js"):
        bare = httpx.get(stack.base + path, timeout=10)
        assert bare.status_code == 401, path
        assert "access token" in bare.text
        wrong = httpx.get(stack.base + path, params={"token": "x" + stack.token}, timeout=10)
        assert wrong.status_code == 401, path
        assert "team-a" not in bare.text + wrong.text
    with httpx.Client(base_url=stack.base, timeout=10) as browser:
        first = browser.get(f"/tenants?token={stack.token}")
        assert first.status_code == 303
        assert first.headers["location"] == "/tenants"  # the token leaves the address bar
        assert "httponly" in first.headers["set-cookie"].lower()
        assert "secure" in first.headers["set-cookie"].lower()
        # A client keeps a Secure cookie for https only (a browser also for localhost,
        # see the headless Chromium tests): sent as a browser on 127.0.0.1 sends it.
        browser.headers["Cookie"] = f"{COOKIE}={stack.token}"
        page = browser.get("/tenants")  # the cookie alone now
        assert page.status_code == 200
        assert 'data-tenant="team-a"' in page.text
        assert browser.get("/").headers["location"] == "/tenants"
    assert httpx.get(stack.base + "/healthz", timeout=10).text == "ok"


# -- pages with real data ----------------------------------------------------------------


def test_every_asset_comes_from_the_console_itself(stack: ConsoleProcess) -> None:
    """No CDN: every page links only its own /static/ files (shipped in the package, served
    by the console) and forbids the browser anything else (Content-Security-Policy)."""
    for page in ("/tenants", "/queue", "/fairness", "/audit", "/cost"):
        answer = _get(stack, page)
        assert answer.status_code == 200, page
        policy = answer.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy
        assets = re.findall(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="([^"]*)"', answer.text)
        assert assets, page
        for asset in assets:
            assert asset.startswith("/static/") or asset.startswith("data:"), (page, asset)
            if asset.startswith("/static/"):
                assert _get(stack, asset).status_code == 200, asset


def test_tenants_show_what_fairgate_status_shows_plus_ceiling_and_split(
        stack: ConsoleProcess, redis_server_url: str) -> None:
    status = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "status", "--json", "--redis-url",
         redis_server_url], capture_output=True, text=True, check=True, cwd=ROOT)
    expected = json.loads(status.stdout)["tenants"]
    answer = _get(stack, "/api/tenants").json()
    rows = {row["name"]: row for row in answer["tenants"]}
    assert set(rows) == set(expected) == {"team-a", "team-b", "race"}
    for name, row in rows.items():
        for key, value in expected[name].items():
            assert row[key] == value, (name, key)
    assert rows["team-a"]["used"] == 2.0
    assert rows["team-a"]["ceiling"] == 8.0
    assert rows["team-b"]["used_nominal"] == 1.0
    assert rows["team-b"]["queued"] == {"inference": 0, "training": 2}
    html = _get(stack, "/tenants").text
    assert '<tr data-tenant="team-b">' in html
    assert 'class="bar"' in html
    filtered = _get(stack, "/api/tenants", q="team-b").json()
    assert [r["name"] for r in filtered["tenants"]] == ["team-b"]


def test_queue_rows_say_what_fairgate_why_says(stack: ConsoleProcess,
                                              redis_server_url: str) -> None:
    answer = _get(stack, "/api/queue").json()
    assert answer["total"] == 2
    assert [r["pod"] for r in answer["rows"]] == ["team-b-dev/b-1", "team-b-dev/b-2"]
    for row in answer["rows"]:
        out = io.StringIO()
        assert why_command(redis_server_url, row["pod"], json_out=True, out=out) == 0
        why = json.loads(out.getvalue())
        assert row["why"] == why["summary"]
        assert row["position"] == why["position"]
        assert row["class"] == "training"
        assert row["demand"] == "gpu=1"
        assert row["waited_seconds"] >= 0
    assert answer["rows"][0]["position"] == 1
    assert _get(stack, "/api/queue", tenant="team-a").json()["total"] == 0
    assert _get(stack, "/api/queue", namespace="team-b-dev").json()["total"] == 2
    assert _get(stack, "/api/queue", namespace="sandbox").json()["rows"] == []
    html = _get(stack, "/queue").text
    assert 'data-pod="team-b-dev/b-2"' in html
    assert "waiting for 1.00 GPU-eq of tenant quota" in html


def test_queue_pages_through_every_waiting_pod(stack: ConsoleProcess,
                                              redis_server_url: str) -> None:
    client = redis.Redis.from_url(redis_server_url)
    queue = FairQueue(client)
    data = ConsoleData(client, queue, FairnessHistory(client, queue))
    everyone = Viewer("test", everything=True)
    first = data.queue_page(everyone, page=1, per_page=1)
    second = data.queue_page(everyone, page=2, per_page=1)
    beyond = data.queue_page(everyone, page=3, per_page=1)
    tickets = [e for t, s, _n in queue.lanes(["team-b"])
               for e in queue.lane_entries(t, s, 0, -1)] + [str(uuid.uuid4())]
    now = time.time()
    together = queue.ticket_statuses(tickets, now)
    one_by_one = [queue.ticket_status(t, now) for t in tickets]
    client.close()
    assert together == one_by_one and len(together) == 3 and together[-1] is None
    assert (first["pages"], first["total"]) == (2, 2)
    assert [r["pod"] for r in first["rows"] + second["rows"]] == [
        "team-b-dev/b-1", "team-b-dev/b-2"]
    assert beyond["rows"] == []


def test_audit_is_searchable_and_shows_the_chain_status(stack: ConsoleProcess) -> None:
    found = _get(stack, "/api/audit", q="b-1").json()
    assert found["records"]
    assert all("b-1" in r["name"] for r in found["records"])
    denied = _get(stack, "/api/audit", decision="deny").json()["records"]
    assert [(r["namespace"], r["name"]) for r in denied] == [("sandbox", "s-0")]
    assert found["chain"]["ok"] is True
    assert found["chain"]["checked"] >= 6
    html = _get(stack, "/audit", q="sandbox").text
    assert 'data-chain="ok"' in html
    assert "s-0" in html and "a-0" not in html


def test_a_broken_chain_shows_as_broken(stack: ConsoleProcess, redis_server_url: str) -> None:
    """A copy of the stream with one record edited (the real stream stays intact)."""
    client = redis.Redis.from_url(redis_server_url)
    copy = "fairgate:audit-tampered"
    entries = client.xrange(STREAM)
    for i, (entry_id, fields) in enumerate(entries):
        if i == 2:
            fields = {k: v.replace(b"team-b", b"team-x") for k, v in fields.items()}
        client.xadd(copy, fields, id=entry_id)
    client.hset(copy + ":head", mapping=client.hgetall(STREAM + ":head"))
    queue = FairQueue(client)
    data = ConsoleData(client, queue, FairnessHistory(client, queue),
                       audit=AuditLog(client, stream=copy, out=io.StringIO()))
    try:
        status = data.verify(force=True)
        admin = data.chain_status(Viewer("ta", tenants=frozenset({"team-b"})))
        page = data.audit(Viewer("p", everything=True))
    finally:
        client.delete(copy, copy + ":head")
        client.close()
    assert status["ok"] is False
    assert status["summary"].startswith("BROKEN at seq 3")
    assert page["chain"]["ok"] is False
    assert admin["ok"] is False and "platform admin" in admin["summary"]
    assert "seq" not in admin["summary"]


def test_fairness_history_is_drawn_as_svg(stack: ConsoleProcess) -> None:
    deadline = time.monotonic() + 10
    series: dict[str, Any] = {}
    while time.monotonic() < deadline:
        series = _get(stack, "/api/fairness", hours="1").json()["series"]
        if len(series.get("team-a", [])) >= 2:
            break
        time.sleep(0.5)
    assert len(series["team-a"]) >= 2
    _t, used, entitled = series["team-a"][-1]
    assert (used, entitled) == (2.0, 2.0)
    html = _get(stack, "/fairness", hours="1").text
    chart = re.search(r'<figure class="chart" data-tenant="team-a">.*?</figure>', html, re.S)
    assert chart is not None
    points = re.search(r'class="line used" points="([^"]+)"', chart.group(0))
    assert points is not None and len(points.group(1).split()) >= 2
    assert "Jain's index" in html


def test_the_status_report_is_shared_until_the_next_decision_or_its_ttl(tmp_path: Path) -> None:
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        config = load_config_dir(write_config(tmp_path / "config"))
        queue.sync_config(config, {"gpu": 8})
        generation = [0]
        data = ConsoleData(client, queue, FairnessHistory(client, queue),
                           generation=lambda: generation[0], status_ttl=3600)
        everyone = Viewer("p", everything=True)

        def used() -> float:
            rows = {r["name"]: r for r in data.tenants(everyone)["tenants"]}
            return float(rows["team-a"]["used"])

        assert used() == 0.0
        queue.admit(PodRequest(str(uuid.uuid4()), "team-a", "team-a-dev", "p", "training",
                               {"gpu": 1}), time.time())
        assert used() == 0.0  # no decision seen yet: the shared report stands
        generation[0] += 1
        assert used() == 1.0
        data.status_ttl = 0.0
        queue.admit(PodRequest(str(uuid.uuid4()), "team-a", "team-a-dev", "q", "training",
                               {"gpu": 1}), time.time())
        assert used() == 2.0  # too old: read again
        client.close()


def test_a_complete_gang_waits_as_one_row_and_filters_by_its_namespace(
        tmp_path: Path) -> None:
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        queue.sync_config(load_config_dir(write_config(tmp_path / "config")), {"gpu": 8})
        for i in range(2):  # 2 x 1 GPU: team-b's nominal is 1 GPU, so the gang waits
            ticket = str(uuid.uuid4())
            queue.admit(PodRequest(ticket, "team-b", "team-b-dev", f"g-{i}", "training",
                                   {"gpu": 1}, group="g", group_size=2), time.time())
            queue.confirm(ticket, str(uuid.uuid4()), "team-b-dev", f"g-{i}")
        data = ConsoleData(client, queue, FairnessHistory(client, queue))
        everyone = Viewer("p", everything=True)
        page = data.queue_page(everyone)
        by_namespace = data.queue_page(everyone, namespace="team-b-dev")
        elsewhere = data.queue_page(everyone, namespace="team-a-dev")
        client.close()
    assert page["total"] == 1
    (row,) = page["rows"]
    assert row["gang"] == "team-b-dev/g" and row["tenant"] == "team-b"
    assert "gang team-b-dev/g" in row["why"]
    # the same row (its wait, rounded to 0.1 s, was read a moment later)
    assert abs(by_namespace["rows"][0].pop("waited_seconds") - row.pop("waited_seconds")) <= 0.2
    assert by_namespace["rows"] == page["rows"]
    assert "never fits" in row["why"] and "waiting for a larger quota" in row["why"]
    assert elsewhere["total"] == 0


def test_a_gang_row_names_where_the_gang_was_declared(tmp_path: Path) -> None:
    """The queue was told the gang's source (the webhook tells it): the row names the gang
    by it, with the queue's counts, as ``fairgate why`` does."""
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        queue.sync_config(load_config_dir(write_config(tmp_path / "config")), {"gpu": 8})
        for i in range(2):  # 2 x 1 GPU: team-b's nominal is 1 GPU, so the gang waits
            ticket = str(uuid.uuid4())
            queue.admit(PodRequest(ticket, "team-b", "team-b-dev", f"trainer-{i}", "training",
                                   {"gpu": 1}, group="job.trainer.0123456789", group_size=2,
                                   group_source="Indexed Job trainer"), time.time())
            queue.confirm(ticket, str(uuid.uuid4()), "team-b-dev", f"trainer-{i}")
        data = ConsoleData(client, queue, FairnessHistory(client, queue))
        page = data.queue_page(Viewer("p", everything=True))
        client.close()
    (row,) = page["rows"]
    assert row["source"] == "Indexed Job trainer" and row["members"] == 2
    assert row["why"].startswith("gang of Indexed Job trainer: 2 of 2 pods created, released "
                                 "together (2 GPUs training), waiting for ")


def _queue_gang(queue: FairQueue, size: int) -> None:
    """Gang ``g`` of ``size`` 1-GPU training pods in team-b-dev, the first created 90 s
    ago, all confirmed."""
    for i in range(size):
        ticket = str(uuid.uuid4())
        queue.admit(PodRequest(ticket, "team-b", "team-b-dev", f"g-{i}", "training",
                               {"gpu": 1}, group="g", group_size=size,
                               submitted_at=time.time() - 90 + i), time.time())
        queue.confirm(ticket, str(uuid.uuid4()), "team-b-dev", f"g-{i}")


def test_the_queue_page_renders_a_waiting_gang_in_headless_chromium(
        tmp_path: Path, driver: WebDriver) -> None:
    """A complete gang waiting as one entry has a row with its class, members and wait,
    on /queue and /queue?tenant=..., over HTTP and in a browser (it answered 500)."""
    config = write_config(tmp_path / "config")
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        queue.sync_config(load_config_dir(config), {"gpu": 8})
        _queue_gang(queue, 2)  # 2 x 1 GPU: team-b's nominal is 1 GPU, so the gang waits
        client.close()
        with ConsoleProcess(url, config, tmp_path / "console.log") as console:
            for params in ({}, {"tenant": "team-b"}):
                page = _get(console, "/queue", **params)
                assert page.status_code == 200, page.text
                assert "gang team-b-dev/g" in page.text
            (row,) = _get(console, "/api/queue").json()["rows"]
            assert row["class"] == "training" and row["members"] == 2
            assert 90 <= row["waited_seconds"] < 150
            _open(driver, console, "queue")
            cells = driver.find_element(By.CSS_SELECTOR, 'tr[data-pod="team-b-dev/g"]')
            texts = [c.text for c in cells.find_elements(By.CSS_SELECTOR, "th, td")]
    assert texts[0] == "gang team-b-dev/g (2 pods)"
    assert texts[1:4] == ["team-b", "-", "training"]
    assert texts[4] == "2 GPUs training"
    assert texts[5].startswith("1m ")
    assert texts[6].startswith("gang team-b-dev/g: 2 of 2 pods created, released together")


def _wait_pod(queue: FairQueue, tenant: str, namespace: str, name: str) -> None:
    """Queue one 1-GPU training pod (confirmed, so it does not expire)."""
    ticket = str(uuid.uuid4())
    answer = queue.admit(PodRequest(ticket, tenant, namespace, name, "training", {"gpu": 1}),
                         time.time())
    assert answer.outcome == "queued", answer
    queue.confirm(ticket, str(uuid.uuid4()), namespace, name)


def test_the_namespace_filter_reads_only_indexed_tenants_and_stays_exact(
        tmp_path: Path) -> None:
    """The index names every tenant with pods in a namespace: from the scan (a pod queued
    under another tenant than the namespace's owner now), from audit records, from the
    config's owner; what nothing announced, the next scan finds. Checked against
    reading every lane."""
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        blocking = redis.Redis.from_url(url)
        queue = FairQueue(client)
        config = load_config_dir(write_config(tmp_path / "config"))
        queue.sync_config(config, {"gpu": 1})
        queue.admit(PodRequest(str(uuid.uuid4()), "team-a", "team-a-dev", "run", "training",
                               {"gpu": 1}), time.time())  # the only GPU: the rest waits
        for name in ("a-1", "a-2"):
            _wait_pod(queue, "team-a", "team-a-dev", name)
        _wait_pod(queue, "team-b", "team-b-dev", "b-1")
        _wait_pod(queue, "team-b", "team-a-dev", "moved")  # before a relabel, say
        index = NamespaceIndex(client, queue, STREAM, rescan=3600)
        history = FairnessHistory(client, queue)
        data = ConsoleData(client, queue, history, lambda: config, namespaces=index)
        every_lane = ConsoleData(client, queue, history, lambda: config)
        log = AuditLog(client, out=io.StringIO())
        everyone = Viewer("p", everything=True)

        def pods(source: ConsoleData, namespace: str, viewer: Viewer = everyone) -> list[str]:
            return sorted(r["pod"] for r in source.queue_page(viewer, namespace=namespace)["rows"])

        def settles(namespace: str, expected: list[str]) -> None:
            deadline = time.monotonic() + 10
            while pods(data, namespace) != expected:
                assert time.monotonic() < deadline, (namespace, pods(data, namespace))
                time.sleep(0.05)
            assert pods(every_lane, namespace) == expected

        assert index.tenants("team-a-dev") is None
        assert pods(data, "team-a-dev") == pods(every_lane, "team-a-dev")  # not scanned yet
        events = Broadcaster(blocking, STREAM, queue.tenant_names, block=0.1,
                             namespaces=index)
        events.start()
        try:
            deadline = time.monotonic() + 10
            while index.tenants("team-a-dev") is None:  # the producer's first scan
                assert time.monotonic() < deadline, "the index was never scanned"
                time.sleep(0.05)
            assert index.tenants("team-a-dev") == frozenset({"team-a", "team-b"})
            settles("team-a-dev", ["team-a-dev/a-1", "team-a-dev/a-2", "team-a-dev/moved"])
            assert pods(data, "team-a-dev", Viewer("a", tenants=frozenset({"team-a"}))) == [
                "team-a-dev/a-1", "team-a-dev/a-2"]
            assert pods(data, "team-a-dev", Viewer("b", tenants=frozenset({"team-b"}))) == [
                "team-a-dev/moved"]
            # announced by its audit record (team-b-dev is team-b's, not race's)
            _wait_pod(queue, "race", "team-b-dev", "r-1")
            log.record("queue", tenant="race", namespace="team-b-dev", name="r-1")
            settles("team-b-dev", ["team-b-dev/b-1", "team-b-dev/r-1"])
            # its namespace's owner in the config: seen before any audit record
            assert index.tenants("race-dev") == frozenset()
            _wait_pod(queue, "race", "race-dev", "r-2")
            assert pods(data, "race-dev") == ["race-dev/r-2"]
            # announced by nothing: the next scan finds it
            _wait_pod(queue, "team-a", "sandbox", "s-1")
            assert pods(data, "sandbox") == []
            assert pods(every_lane, "sandbox") == ["sandbox/s-1"]
            index.rescan = 0.0
            settles("sandbox", ["sandbox/s-1"])
        finally:
            events.stop()
            client.close()
            blocking.close()


def test_the_console_serves_https_with_a_certificate_of_fairgate_certs(
        tmp_path: Path, redis_server_url: str) -> None:
    """--cert-dir: HTTPS with the pair `fairgate certs generate` writes, a
    renewed pair served without a restart, the token cookie Secure; no plain HTTP."""
    tls = tmp_path / "tls"
    first = write_bundle(tls, "fairgate-console", "fairgate-system", ("127.0.0.1",))
    old_ca = first.ca_cert.read_bytes()
    (tmp_path / "old-ca.crt").write_bytes(old_ca)
    with ConsoleProcess(redis_server_url, None, tmp_path / "console.log", "--cert-dir",
                        str(tls), ca=first.ca_cert) as console:
        assert re.fullmatch(r"console: https://127\.0\.0\.1:\d+/\?token=[\w-]{32}",
                            console.first_line)
        with console.client() as client:
            assert client.get("/api/tenants").status_code == 200
            login = client.get("/tenants", params={"token": console.token},
                               headers={"Authorization": ""})
            assert login.status_code == 303
            assert "secure" in login.headers["set-cookie"].lower()
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA
            httpx.get(console.base + "/healthz", timeout=5)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on its port
            httpx.get(console.base.replace("https:", "http:") + "/healthz", timeout=5)
        renewed = write_bundle(tls, "fairgate-console", "fairgate-system", ("127.0.0.1",))
        trusts_new = ssl.create_default_context(cafile=str(renewed.ca_cert))
        deadline = time.monotonic() + 15
        while True:
            try:
                answer = httpx.get(console.base + "/healthz", timeout=5, verify=trusts_new)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the renewed certificate was never served"
                time.sleep(0.2)
        assert answer.text == "ok"
        with pytest.raises(httpx.ConnectError):
            httpx.get(console.base + "/healthz", timeout=5, verify=ssl.create_default_context(
                cafile=str(tmp_path / "old-ca.crt")))


def test_plain_http_is_refused_off_loopback_unless_a_proxy_is_said_to_terminate_tls(
        tmp_path: Path, redis_server_url: str) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "console", "--redis-url", redis_server_url,
         "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert refused.returncode == 2  # a usage error, as serve's and dispatch's
    assert "refusing to serve plain HTTP on 0.0.0.0" in refused.stderr
    assert "--cert-dir" in refused.stderr and "--plain-http" in refused.stderr
    assert refused.stdout == ""
    with ConsoleProcess(redis_server_url, None, tmp_path / "console.log", "--host", "0.0.0.0",
                        "--plain-http") as console:
        assert console.first_line.startswith("console: http://127.0.0.1:")


def _login_cookie(console: ConsoleProcess, **headers: str) -> str:
    """The Set-Cookie of a first visit with ``?token=`` (no other credential)."""
    answer = httpx.get(f"{console.base}/tenants", params={"token": console.token},
                       headers=headers, timeout=10, verify=console.verify)
    assert answer.status_code == 303
    return answer.headers["set-cookie"]


def test_the_token_cookie_is_secure_behind_a_tls_terminating_proxy(
        tmp_path: Path, redis_server_url: str) -> None:
    """--plain-http (a proxy ends TLS): the proxy reaches the console over http from an
    address it does not trust for X-Forwarded-Proto, yet the cookie that carries the
    token is Secure, HttpOnly and SameSite=Strict; start-up says so."""
    log = tmp_path / "console.log"
    with ConsoleProcess(redis_server_url, None, log, "--host", "0.0.0.0",
                        "--plain-http") as console:
        for headers in ({}, {"X-Forwarded-Proto": "http"}, {"X-Forwarded-Proto": "https"}):
            cookie = [part.strip().lower() for part in _login_cookie(console, **headers)
                      .split(";")]
            assert cookie[0] == f"{COOKIE}={console.token}".lower()
            assert {"secure", "httponly", "samesite=strict"} <= set(cookie), cookie
    assert "the access-token cookie is Secure" in log.read_text()


def test_an_insecure_cookie_is_the_operators_choice_and_said_at_start_up(
        tmp_path: Path, redis_server_url: str) -> None:
    log = tmp_path / "console.log"
    with ConsoleProcess(redis_server_url, None, log, "--insecure-cookie",
                        "--forwarded-allow-ips", "127.0.0.1") as console:
        cookie = [part.strip().lower() for part in _login_cookie(console).split(";")]
        assert "secure" not in cookie and {"httponly", "samesite=strict"} <= set(cookie)
    assert "WARNING: --insecure-cookie" in log.read_text()


def test_cost_bills_this_month_from_the_verified_audit_log() -> None:
    """Pods the dispatcher saw start are billed from their start (team-a: 2 GPUs for
    1 h, team-b: 1 GPU still running, 30 min); a tenant viewer gets its rows only, a
    platform viewer the totals too; the page shows the rows."""
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        log = AuditLog(client, out=io.StringIO())
        for ticket, tenant, demand, start, end in (("a1", "team-a", "gpu=2", 2.0, 1.0),
                                                   ("b1", "team-b", "gpu=1", 0.5, None)):
            common = {"uid": ticket, "tenant": tenant, "pod_class": "training",
                      "demand": demand}
            log.record("start", time=format_time(now - timedelta(hours=start)),
                       diff=start_detail("training", "n1", None), **common)
            if end is not None:
                log.record("release", time=format_time(now - timedelta(hours=end)),
                           reason="pod Succeeded", **common)
        queue = FairQueue(client)
        data = ConsoleData(client, queue, FairnessHistory(client, queue))
        everyone = data.cost(Viewer("p", everything=True), now=now)
        team_b = data.cost(Viewer("b", tenants=frozenset({"team-b"})), now=now)
        client.close()
    assert everyone["available"] is True, everyone
    hours = {r["tenant"]: r["gpu_hours"] for r in everyone["rows"]}
    assert hours == pytest.approx({"team-a": 2.0, "team-b": 0.5})
    assert everyone["totals"]["gpu_hours"] == pytest.approx(2.5)
    assert [r["tenant"] for r in team_b["rows"]] == ["team-b"]
    assert "totals" not in team_b and "team-a" not in json.dumps(team_b)


def test_cost_is_refused_when_the_audit_chain_does_not_verify() -> None:
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        log = AuditLog(client, out=io.StringIO())
        for i in range(3):
            log.record("admit", uid=f"t{i}", tenant="team-a", demand="gpu=1",
                       reason="reserved as training")
        first = client.xrange(log.stream, count=2)[1][0]
        client.xdel(log.stream, first)
        queue = FairQueue(client)
        data = ConsoleData(client, queue, FairnessHistory(client, queue))
        answer = data.cost(Viewer("p", everything=True))
        client.close()
    assert answer["available"] is False and "does not verify" in answer["message"]


def test_bad_parameters_say_what_to_use(stack: ConsoleProcess) -> None:
    bad = _get(stack, "/api/queue", page="x")
    assert bad.status_code == 400
    assert bad.json() == {"error": "page='x' is not a whole number: use 1 to 1000000"}
    hours = _get(stack, "/fairness", hours="1000")
    assert hours.status_code == 400
    assert "hours=1000 is out of range: use 0.1 to 168" in hours.text
    missing = _get(stack, "/nope")
    assert missing.status_code == 404 and "/tenants" in missing.text


# -- live updates ----------------------------------------------------------------------


def test_a_decision_arrives_on_the_event_stream_within_2s(
        stack: ConsoleProcess, shared_server: ServeProcess) -> None:
    got: dict[str, float] = {}
    ready = threading.Event()

    def listen() -> None:
        with stack.client() as client, client.stream("GET", "/api/events",
                                                      timeout=10) as events:
            event = ""
            for line in events.iter_lines():
                if line == ": connected":
                    ready.set()
                if line.startswith("event: "):
                    event = line[7:]
                if (line.startswith("data: ") and event == "decision"
                        and json.loads(line[6:])["pod"] == "race-dev/live-0"):
                    got["at"] = time.monotonic()
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)
    posted = time.monotonic()
    _post(shared_server, "race-dev", "live-0")
    listener.join(5)
    assert "at" in got, "no decision event for race-dev/live-0"
    assert got["at"] - posted <= 2.0


def test_redis_down_answers_503_saying_so(tmp_path: Path) -> None:
    with local_redis() as url:
        console = ConsoleProcess(url, None, tmp_path / "console.log")
        console.start()
    try:
        answer = _get(console, "/api/tenants")
        assert answer.status_code == 503
        assert "cannot read Redis at" in answer.json()["error"]
        assert "--redis-url" in answer.json()["error"]
    finally:
        console.stop()


def test_demo_with_console_keeps_the_stack_up_and_prints_the_url(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    demo = subprocess.Popen([sys.executable, "-m", "webhook.cli", "demo", "--console",
                             "--pods", "40"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    assert demo.stdout is not None
    seen = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("console: "):
                break
        url = seen[-1].removeprefix("console: ").strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]+", url), "".join(seen)
        assert any("audit chain:" in line for line in seen)
        base, token = url.split("/?token=")
        tenants = httpx.get(base + "/api/tenants", timeout=10,
                            headers={"Authorization": f"Bearer {token}"}).json()["tenants"]
        assert {"team-a", "team-b", "team-c"} <= {t["name"] for t in tenants}
        audit = httpx.get(base + "/api/audit", timeout=30,
                          headers={"Authorization": f"Bearer {token}"}).json()
        assert audit["chain"]["ok"] and audit["records"]
    finally:
        demo.send_signal(signal.SIGINT)
        code = demo.wait(30)
    assert code == 130  # Ctrl-C
    assert list(tmp_path.iterdir()) == []  # the demo still cleans up after itself


# -- a tenant admin sees only its tenant ------------------------------------------------


def test_a_tenant_viewer_sees_nothing_of_other_tenants_in_any_answer(
        stack: ConsoleProcess, shared_server: ServeProcess, redis_server_url: str) -> None:
    client = redis.Redis.from_url(redis_server_url)
    queue = FairQueue(client)
    config = load_config_dir(shared_server.config_dir)
    data = ConsoleData(client, queue, FairnessHistory(client, queue), lambda: config)
    viewer = Viewer("team-b-admin", tenants=frozenset({"team-b"}))
    answers = [data.tenants(viewer), data.queue_page(viewer),
               data.queue_page(viewer, tenant="team-a"),
               data.queue_page(viewer, namespace="team-a-dev"), data.fairness(viewer),
               data.fairness(viewer, tenant="team-a"), data.audit(viewer),
               data.audit(viewer, q="team-a"), data.cost(viewer)]
    client.close()
    text = json.dumps(answers)
    for other in ("team-a", "race", "sandbox", "capacity_notes", "jain_index\": ["):
        assert other not in text
    assert '"name": "team-b"' in text
    assert "b-1" in text


def test_the_event_stream_sends_a_tenant_viewer_only_its_tenants_decisions() -> None:
    with local_redis() as url:
        _check_event_isolation(url)


def _check_event_isolation(url: str) -> None:
    client = redis.Redis.from_url(url)
    queue = FairQueue(client)
    client.sadd("fairgate:tenants", "team-a", "team-b")
    events = Broadcaster(client, STREAM, queue.tenant_names, block=0.2)
    log = AuditLog(client, out=io.StringIO())

    async def watch() -> tuple[list[str], list[str]]:
        admin = events.subscribe(Viewer("b", tenants=frozenset({"team-b"})))
        platform = events.subscribe(Viewer("p", everything=True))
        assert await anext(admin) == ": connected\n\n"
        assert await anext(platform) == ": connected\n\n"
        events.start()
        await asyncio.sleep(0.5)  # the producer starts at the stream's end
        await asyncio.to_thread(log.record, "queue", tenant="team-a", namespace="team-a-dev",
                                name="x", reason="waiting behind team-b-dev/y")
        await asyncio.to_thread(log.record, "queue", tenant="team-b", namespace="team-b-dev",
                                name="y", reason="capacity held for team-a (first)")
        seen_admin = [await asyncio.wait_for(anext(admin), 5)]
        seen_platform = [await asyncio.wait_for(anext(platform), 5) for _ in range(2)]
        await admin.aclose()
        await platform.aclose()
        return seen_admin, seen_platform

    try:
        seen_admin, seen_platform = asyncio.run(watch())
    finally:
        events.stop()
        client.close()
    assert "team-b-dev/y" in seen_admin[0]
    assert "team-a" not in seen_admin[0]
    assert "(another tenant)" in seen_admin[0]
    assert "team-a-dev/x" in seen_platform[0] and "team-b-dev/y" in seen_platform[1]
    assert events.clients == 0


def test_an_idle_event_stream_client_costs_no_redis_call() -> None:
    """300 subscribed, idle clients: the Redis commands in 2 s are those of no client
    (the one producer's blocking reads); per-client polling would add hundreds."""
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        blocking = redis.Redis.from_url(url)
        events = Broadcaster(blocking, STREAM, FairQueue(client).tenant_names, block=0.2)

        def commands() -> int:
            return int(client.info("stats")["total_commands_processed"])

        async def idle(clients: int) -> int:
            streams = [events.subscribe(Viewer(f"v{i}", everything=True))
                       for i in range(clients)]
            for stream in streams:
                assert await anext(stream) == ": connected\n\n"
            before = commands()
            await asyncio.sleep(2)
            used = commands() - before
            for stream in streams:
                await stream.aclose()
            return used

        events.start()
        try:
            time.sleep(0.5)
            alone = asyncio.run(idle(0))
            crowded = asyncio.run(idle(300))
        finally:
            events.stop()
            client.close()
            blocking.close()
    assert alone > 0  # the producer's reads are counted
    assert crowded <= alone + 3, (alone, crowded)


def test_token_access_compares_the_whole_token() -> None:
    access = TokenAccess("secret-token")
    assert access.authenticate("secret-token").everything
    for wrong in (None, "", "secret", "secret-token2"):
        with pytest.raises(Exception, match="token"):
            access.authenticate(wrong)


# -- a real browser ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    chrome = browser()
    yield chrome
    chrome.quit()


def _open(driver: WebDriver, console: ConsoleProcess, page: str) -> None:
    driver.get(f"{console.base}/{page}?token={console.token}")
    WebDriverWait(driver, 10).until(
        lambda d: d.find_element(By.ID, "live").text == "live updates: on")


BROWSER_EXPECTS = {
    "tenants": ('tr[data-tenant="team-a"] td[data-used]', "2.00 (2.00 + 0.00)"),
    "queue": ('tr[data-pod="team-b-dev/b-1"] td[data-why]',
              "queued: position 1 of 2 for team-b/training, waiting for 1.00 GPU-eq of "
              "tenant quota"),
    "fairness": ('figure[data-tenant="team-b"] figcaption', "team-b: now 1.00 used of 1.00 "
                 "entitled"),
    "audit": ("p[data-chain]", "Hash chain: verified"),
    "cost": ("p[data-window]", "This month so far"),
}


@pytest.mark.parametrize("page", list(BROWSER_EXPECTS))
def test_every_page_renders_its_data_in_headless_chromium(
        stack: ConsoleProcess, driver: WebDriver, page: str) -> None:
    _open(driver, stack, page)
    selector, text = BROWSER_EXPECTS[page]
    assert driver.find_element(By.CSS_SELECTOR, selector).text.startswith(text)
    assert driver.current_url == f"{stack.base}/{page}"  # the token left the address bar
    current = driver.find_element(By.CSS_SELECTOR, 'nav a[aria-current="page"]')
    assert current.text == page.capitalize()


@pytest.mark.parametrize("page", list(BROWSER_EXPECTS))
def test_axe_finds_no_serious_accessibility_violation(
        stack: ConsoleProcess, driver: WebDriver, page: str) -> None:
    _open(driver, stack, page)
    axe = Axe(driver)
    axe.inject()
    results = axe.run()
    serious = [(v["id"], v["help"], len(v["nodes"])) for v in results["violations"]
               if v["impact"] in ("serious", "critical")]
    assert serious == []


def test_the_keyboard_reaches_the_skip_link_the_pages_and_the_filters(
        stack: ConsoleProcess, driver: WebDriver) -> None:
    _open(driver, stack, "queue")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    skip = driver.switch_to.active_element
    assert skip.text == "Skip to content"
    skip.send_keys(Keys.ENTER)
    assert driver.switch_to.active_element.get_attribute("id") == "content"
    reached = []
    for _ in range(12):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        element = driver.switch_to.active_element
        reached.append(element.get_attribute("id") or element.text)
    assert "qt" in reached and "qn" in reached  # the tenant and namespace filters
    _open(driver, stack, "tenants")
    ActionChains(driver).send_keys(Keys.TAB, Keys.TAB, Keys.TAB).perform()
    assert driver.switch_to.active_element.text == "Queue"  # skip link, Tenants, Queue


def test_a_browser_page_updates_itself_after_a_decision(
        stack: ConsoleProcess, shared_server: ServeProcess, driver: WebDriver) -> None:
    _open(driver, stack, "queue")
    _post(shared_server, "team-b-dev", "live-b")
    posted = time.monotonic()
    WebDriverWait(driver, 5).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-pod="team-b-dev/live-b"]'))
    assert "latest decision: queue team-b-dev/live-b" in driver.find_element(
        By.ID, "last-event").text
    assert time.monotonic() - posted < 5


def test_the_tenants_page_shows_reclaims_a_viewer_may_see() -> None:
    """The dispatcher's reclaim notes: a platform viewer gets every line, a tenant viewer
    the header and no reclaim that names a tenant it does not see."""
    entry = {"at": 1_700.0, "pod": "old-ns/old-1", "tenant": "old", "for": "new-ns/new-0",
             "for_tenant": "new", "ran_seconds": 700.0, "gpu_equivalents": 4.0}
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        queue.write_reclaim_notes({"on": True, "at": 1_700.0, "after": 60.0,
                                   "min_runtime": 600.0, "per_hour": 12, "last_hour": 1,
                                   "recent": [entry]})
        data = ConsoleData(client, queue, FairnessHistory(client, queue))
        everyone = data.tenants(Viewer("p", everything=True))
        new_only = data.tenants(Viewer("n", tenants=frozenset({"new"})))
        client.close()
    assert everyone["reclaim"][0].startswith("reclaim: on (after 60s waiting")
    assert "reclaimed old-ns/old-1 of tenant old" in everyone["reclaim"][1]
    assert everyone["reclaim"][0].endswith(": 1 reclaimed in the last hour")
    assert new_only["reclaim"] == [
        "reclaim: on (after 60s waiting, pods that ran at least 600s, at most 12 an hour)"]


# -- read at a glance: one scale, a legend, units, shapes in words, 800 px wide ---------


def test_fairness_charts_share_one_scale_with_a_legend_and_units(
        stack: ConsoleProcess, driver: WebDriver) -> None:
    """team-a uses 2 GPUs, team-b 1: both charts are drawn on one y-scale (the same
    ticks, team-b's line half as high), each says its unit, and a legend names the solid
    and the dashed line."""
    _open(driver, stack, "fairness")
    figures = {f.get_attribute("data-tenant"): f for f in driver.find_elements(
        By.CSS_SELECTOR, "figure[data-tenant]")}
    assert {"team-a", "team-b"} <= set(figures)
    ticks = {tenant: [t.text for t in figure.find_elements(By.CSS_SELECTOR,
                                                           "text.tick:not(.time)")]
             for tenant, figure in figures.items()}
    assert len({tuple(t) for t in ticks.values()}) == 1, ticks  # one scale
    assert float(ticks["team-a"][-1]) >= 2  # team-a's 2 GPUs fit it
    for figure in figures.values():
        assert figure.find_element(By.CSS_SELECTOR, "text.unit").text == "GPU-eq"
    legend = driver.find_element(By.CSS_SELECTOR, "[data-legend]")
    assert legend.is_displayed()
    assert [item.text for item in legend.find_elements(By.TAG_NAME, "li")] == [
        "used (solid)", "entitlement (dashed)"]
    used = legend.find_element(By.CSS_SELECTOR, "line.used")
    assert used.value_of_css_property("stroke") == figures["team-a"].find_element(
        By.CSS_SELECTOR, "polyline.used").value_of_css_property("stroke")


def test_a_shape_on_the_queue_page_is_said_in_words(tmp_path: Path, driver: WebDriver) -> None:
    """A gang of 4 x 1 GPU of team-b (nominal 1, borrowLimit 3) waits as one entry above
    its nominal quota: its lane's shape (b/gpu=4) reads "4 GPUs borrowed", in its
    Demand cell and its why; a single pod's shape is said so too."""
    config = write_config(tmp_path / "config")
    config.joinpath("quota-team-b.yaml").write_text(
        "nominal: {gpu: 1}\nborrowLimit: {gpuEquivalents: 3}\ndefaultClass: training\n")
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        queue = FairQueue(client)
        queue.sync_config(load_config_dir(config), {"gpu": 8})
        hog = PodRequest(str(uuid.uuid4()), "team-a", "team-a-dev", "hog", "training",
                         {"gpu": 7}, submitted_at=time.time() - 120)
        queue.admit(hog, time.time())
        queue.confirm(hog.ticket, str(uuid.uuid4()), "team-a-dev", "hog")
        _queue_gang(queue, 4)
        _wait_pod(queue, "team-b", "team-b-dev", "solo")
        client.close()
        with ConsoleProcess(url, config, tmp_path / "console.log") as console:
            [row] = [r for r in _get(console, "/api/queue").json()["rows"]
                     if r["pod"] == "team-b-dev/g"]
            assert row["shape"] == "b/gpu=4"
            _open(driver, console, "queue")
            cells = driver.find_element(By.CSS_SELECTOR, 'tr[data-pod="team-b-dev/g"]')
            texts = [c.text for c in cells.find_elements(By.CSS_SELECTOR, "th, td")]
            solo = driver.find_element(By.CSS_SELECTOR, 'tr[data-pod="team-b-dev/solo"]')
            solo_texts = [c.text for c in solo.find_elements(By.CSS_SELECTOR, "th, td")]
    assert solo_texts[4] == "1 GPU training", solo_texts
    assert texts[4] == "4 GPUs borrowed"
    assert "released together (4 GPUs borrowed)" in texts[6]
    assert "b/gpu" not in " ".join(texts)


# Every element of a page that ends beyond the window's right edge, or whose text is cut
# by its own box (overflow hidden), and the page's own horizontal overflow.
CUT_AT_WIDTH = """
const width = document.documentElement.clientWidth;
const cut = [];
if (document.documentElement.scrollWidth > width)
  cut.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + width);
for (const el of document.querySelectorAll('header *, main *, footer *')) {
  if (el.closest('.skip')) continue;
  const box = el.getBoundingClientRect();
  const what = el.tagName + ' ' + (el.textContent || '').trim().slice(0, 50);
  if (box.width > 0 && box.right > width + 1) cut.push('beyond the edge: ' + what);
  if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible')
    cut.push('clipped: ' + what);
}
return cut;
"""


@pytest.fixture(scope="module")
def narrow() -> Iterator[WebDriver]:
    """Headless Chromium in a window 800 px wide."""
    chrome = browser("800,900")
    yield chrome
    chrome.quit()


@pytest.mark.parametrize("page", list(BROWSER_EXPECTS))
def test_nothing_is_cut_in_a_window_800_px_wide(
        stack: ConsoleProcess, narrow: WebDriver, page: str) -> None:
    _open(narrow, stack, page)
    assert narrow.execute_script("return window.innerWidth") == 800
    assert narrow.execute_script(CUT_AT_WIDTH) == []

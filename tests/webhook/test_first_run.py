"""A new user's first run: ``fairgate certs generate --out ./certs`` in a working
directory, then ``fairgate demo --console`` from that same directory (which also holds
directories named like fairgate's packages), a gang waiting on the demo's stack, and
every route the console serves walked over HTTP and rendered in headless Chromium: no
5xx, no error page, no message in the browser's console (a JavaScript error, a refused
or failed load), the live updates connected, the gang on the Queue page and the demo's
run on the Fairness page's charts, with their time axis. And every example trace of
``examples/`` through ``fairgate simulate``, as the README and the help point at them.

The demo is started as the ``fairgate`` entry point starts it: ``python -P`` keeps the
working directory off the import path of the command itself (the console script's own
directory is its path entry), so only the demo's children can trip over it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx
import pytest
from console_helpers import browser
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from starlette.routing import Route

from audit import STREAM
from fairshare.connection import RedisTarget, connect_redis
from fairshare.queue.fairqueue import FairQueue
from tenants.localdir import load_config_dir
from webhook.console.access import TokenAccess
from webhook.console.app import PAGES, create_app
from webhook.console.data import ConsoleData
from webhook.console.events import Broadcaster
from webhook.console.history import FairnessHistory
from webhook.demo import HORIZON, SAMPLE_EVERY, DemoPod, Denied, WebhookClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHADOWS = ("audit", "cost", "tenants", "webhook", "fairshare", "admission")
"""Directories of the working directory named like fairgate's packages (and ./certs)."""
GANG = "team-b-ml/ddp-new"
TOO_BIG = "team-b-ml/too-big"
"""A pod of 8 GPUs: above team-b's ceiling of 6, so it is refused (never-fits)."""


@dataclass(frozen=True)
class DemoStack:
    """What ``fairgate demo --console`` printed, and the Redis it runs on."""

    output: str
    console: str
    token: str
    serve: str
    workdir: Path
    redis: RedisTarget
    cwd: Path
    tmpdir: Path


def _env(tmpdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "REDIS_PASSWORD", "REDIS_PASSWORD_FILE",
                        "KUBERNETES_SERVICE_HOST")}
    return {**env, "TMPDIR": str(tmpdir), "PYTHONPATH": str(ROOT)}


def _fairgate(*args: str) -> list[str]:
    """``fairgate args`` as the installed entry point runs it (see the module doc)."""
    return [sys.executable, "-P", "-m", "webhook.cli", *args]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    """``fairgate demo --console --pods 40`` run from a directory holding ./certs (from
    the help's own ``certs generate`` example) and packages that raise on import; at the
    end Ctrl-C stops it quietly, and it leaves nothing behind."""
    base = tmp_path_factory.mktemp("first-run")
    cwd, tmpdir = base / "work", base / "tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    env = _env(tmpdir)
    generated = subprocess.run(_fairgate("certs", "generate", "--out", "./certs"), cwd=cwd,
                               env=env, capture_output=True, text=True, timeout=60)
    assert generated.returncode == 0, generated.stderr
    for name in SHADOWS:
        (cwd / name).mkdir()
        (cwd / name / "__init__.py").write_text(
            f"raise ImportError('{name} from the working directory')\n")
    process = subprocess.Popen(_fairgate("demo", "--console", "--pods", "40"), cwd=cwd,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    assert process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("console: "):
                break
        output = "".join(seen)
        assert seen and seen[-1].startswith("console: "), output
        url = seen[-1].removeprefix("console: ").strip()
        console, token = url.split("/?token=")
        hint = re.search(r"REDIS_URL=(\S+) REDIS_PASSWORD=(\S+) fairgate status", output)
        serve = re.search(r"fairgate serve is up at (https://\S+)", output)
        workdir = re.search(r"work\s+dir\s+(\S+)", output)
        assert hint and serve and workdir, output
        yield DemoStack(output, console, token, serve.group(1), Path(workdir.group(1)),
                        RedisTarget(hint.group(1), hint.group(2)), cwd, tmpdir)
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, to the group as a terminal sends it
        rest, _ = process.communicate(timeout=30)
    assert process.returncode == 130, rest
    assert rest == "", rest  # nothing failed on the way out (its Redis was still up)
    assert list(tmpdir.iterdir()) == []  # the demo removed what it wrote
    assert sorted(p.name for p in (cwd / "certs").iterdir()) == [
        "ca.crt", "ca.key", "tls.crt", "tls.key"]


@pytest.fixture(scope="module")
def gang_waiting(demo: DemoStack) -> str:
    """team-b's quota held by three 2-GPU pods (6 GPUs: its nominal 5 and its borrow
    limit 1), then a gang of two 1-GPU pods, all sent to the demo's webhook as real
    AdmissionReviews; the gang waits. Then :data:`TOO_BIG`, refused. Each pod is confirmed
    as the dispatcher confirms a pod it sees (so nothing expires)."""
    config = load_config_dir(demo.workdir / "config")
    context = ssl.create_default_context(cafile=str(demo.workdir / "certs" / "ca.crt"))
    pods = [DemoPod("team-b-ml", f"hold-{i}", {"gpu": 2}, pod_class="training")
            for i in range(3)]
    namespace, group = GANG.split("/")
    pods += [DemoPod(namespace, f"{group}-{m}", {"gpu": 1}, pod_class="training",
                     group=(group, 2)) for m in range(2)]
    client = connect_redis(demo.redis, timeout=10)
    queue = FairQueue(client)
    gated = []
    records = client.xlen(STREAM)
    try:
        with httpx.Client(base_url=demo.serve, verify=context, timeout=30) as http:
            webhook = WebhookClient(http, config)
            for pod in pods:
                answer = webhook.create(pod)
                assert answer is not None
                placement = answer[1]
                gated.append(placement.gated)
                assert queue.confirm(placement.ticket, str(uuid.uuid4()), pod.namespace,
                                     pod.name) == "confirmed"
            namespace, name = TOO_BIG.split("/")
            with pytest.raises(Denied) as denied:
                webhook.create(DemoPod(namespace, name, {"gpu": 8}, pod_class="training"))
            assert denied.value.reason == "never-fits"
        deadline = time.monotonic() + 10  # the webhook appends audit records after it answers
        while client.xlen(STREAM) < records + len(pods) + 1:
            assert time.monotonic() < deadline, "the pods' audit records never arrived"
            time.sleep(0.1)
    finally:
        client.close()
    assert gated[-2:] == [True, True], gated
    return GANG


def _routes(demo: DemoStack) -> list[str]:
    """Every route path the console app serves (so a new page cannot be missed)."""
    client = connect_redis(demo.redis, timeout=10)
    queue = FairQueue(client)
    history = FairnessHistory(client, queue)
    app = create_app(ConsoleData(client, queue, history), TokenAccess(),
                     Broadcaster(client, STREAM, queue.tenant_names, history))
    client.close()
    assert all(isinstance(route, Route) for route in app.routes)
    return [route.path for route in app.routes if isinstance(route, Route)]


STATIC = sorted(item.name for item in (resources.files("webhook.console") / "static").iterdir())
EXTRA_QUERIES = {
    "/queue": ("tenant=team-b", "tenant=team-a", "namespace=team-b-ml", "partial=1"),
    "/tenants": ("q=team", "partial=1"),
    "/fairness": ("hours=1", "tenant=team-a", "partial=1"),
    "/audit": ("decision=deny", "q=team-b-ml", "partial=1"),
    "/cost": ("partial=1",),
}


def _urls(routes: list[str]) -> dict[str, list[str]]:
    """Per route path, the URLs that exercise it."""
    urls: dict[str, list[str]] = {}
    for path in routes:
        if path == "/static/{name}":
            urls[path] = [f"/static/{name}" for name in STATIC]
        else:
            assert "{" not in path, f"a route with parameters the walk does not know: {path}"
            urls[path] = [path] + [f"{path}?{q}" for q in EXTRA_QUERIES.get(path, ())]
    return urls


def test_every_route_answers_without_a_server_error(demo: DemoStack, gang_waiting: str) -> None:
    routes = _routes(demo)
    assert {f"/{p}" for p in PAGES} | {f"/api/{p}" for p in PAGES} <= set(routes)
    headers = {"Authorization": f"Bearer {demo.token}"}
    answered: dict[str, int] = {}
    with httpx.Client(base_url=demo.console, headers=headers, timeout=60) as http:
        for path, urls in _urls(routes).items():
            for url in urls:
                if path == "/api/events":
                    with http.stream("GET", url) as events:
                        answered[url] = events.status_code
                        assert events.headers["content-type"].startswith("text/event-stream")
                    continue
                answer = http.get(url)
                answered[url] = answer.status_code
                if path.startswith("/api/"):
                    assert "error" not in answer.json(), (url, answer.text)
                elif path not in ("/healthz", "/") and not path.startswith("/static/"):
                    assert "data-error" not in answer.text, (url, answer.text)
    assert re.search(r"\n4 virtual hours replayed in \d+\.\d s\n", demo.output), demo.output
    expected = {url: 303 if url == "/" else 200 for url in answered}
    assert answered == expected
    with httpx.Client(base_url=demo.console, headers=headers, timeout=60) as http:
        rows = http.get("/api/queue").json()["rows"]
    (row,) = [r for r in rows if r.get("gang") == gang_waiting]
    assert row["members"] == 2 and row["class"] == "training"


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    chrome = browser()
    yield chrome
    chrome.quit()


def _browser_messages(driver: WebDriver) -> list[str]:
    return [f"{entry['level']}: {entry['message']}" for entry in driver.get_log("browser")]


def test_every_page_renders_in_headless_chromium_with_no_console_message(
        demo: DemoStack, gang_waiting: str, driver: WebDriver) -> None:
    pages = [url for path, urls in _urls(_routes(demo)).items()
             if not path.startswith(("/api/", "/static/")) and path != "/healthz"
             for url in urls if "partial=1" not in url]
    driver.get(f"{demo.console}/?token={demo.token}")  # the URL the demo printed
    WebDriverWait(driver, 15).until(lambda d: d.current_url == f"{demo.console}/tenants")
    rendered: dict[str, list[str]] = {}
    for url in pages:
        driver.get(demo.console + url)
        WebDriverWait(driver, 15).until(
            lambda d: d.find_element(By.ID, "live").text == "live updates: on")
        assert not driver.find_elements(By.CSS_SELECTOR, "[data-error]"), url
        rendered[url] = _browser_messages(driver)
        if url == "/queue":
            row = driver.find_element(By.CSS_SELECTOR, f'tr[data-pod="{gang_waiting}"]')
            group = gang_waiting.split("/")[1]
            assert row.text.startswith(
                f"gang of pod group {group} ({gang_waiting}, 2 pods)"), row.text
        if url == "/fairness":
            _check_fairness_charts(driver, demo.redis)
        if url == "/audit?decision=deny":  # the denial in the words the user was told
            row = next(r for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-seq]")
                       if TOO_BIG in r.text)
            cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            assert cells[2:7] == ["deny", "team-b", TOO_BIG, "training", "gpu=8"], cells
            assert cells[8].startswith("never-fits: pod asks for gpu=8 (8.00 GPU-eq) but "
                                       "team-b may hold at most"), cells
    assert rendered == {url: [] for url in pages}


def _check_fairness_charts(driver: WebDriver, target: RedisTarget) -> None:
    """The demo's run is charted: many samples over its virtual hours, every one where
    Jain's index is defined (two tenants entitled, one using GPUs) on its line, and every
    chart has a time axis from the window's start to now."""
    charts = driver.find_elements(By.CSS_SELECTOR, "figure.chart")
    assert len(charts) >= 4  # Jain's index and the three tenants
    for chart in charts:
        times = [t.text for t in chart.find_elements(By.CSS_SELECTOR, "text.tick.time")]
        assert len(times) == 5 and all(re.fullmatch(r"\d\d:\d\d", t) for t in times), times
    client = connect_redis(target, 5.0)
    try:
        samples = client.xrange("fairgate:fh")
    finally:
        client.close()
    assert len(samples) >= HORIZON / SAMPLE_EVERY * 0.95  # a sample a minute, all kept
    defined = [s for _, s in samples if s[b"j"] != b"n/a"]
    assert len(defined) > 10  # the tenants overlap for part of the run
    jain = driver.find_element(By.CSS_SELECTOR, "figure.chart polyline.line.s0")
    assert len((jain.get_attribute("points") or "").split()) >= len(defined) * 0.95
    used = driver.find_element(
        By.CSS_SELECTOR, 'figure[data-tenant="team-a"] polyline.line.used')
    points = (used.get_attribute("points") or "").split()
    assert len(points) > 10, points
    assert len({p.split(",")[1] for p in points}) > 2  # it went up and down over the run


TRACES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.yaml")
                if "config" not in p.relative_to(ROOT / "examples").parts)


def test_the_example_traces_are_all_there() -> None:
    assert "examples/weights-1-2-3.yaml" in TRACES and len(TRACES) >= 10, TRACES


@pytest.mark.parametrize("trace", TRACES)
def test_every_example_trace_simulates_from_the_command_line(trace: str, tmp_path: Path) -> None:
    """``fairgate simulate TRACE --json`` from the repository root, with its own Redis."""
    result = subprocess.run(_fairgate("simulate", trace, "--json"), cwd=ROOT,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert 0 < report["jain_index"] <= 1 and report["tenants"], report
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("how", "signum"), [("the terminal closed", signal.SIGHUP),
                                             ("kill", signal.SIGTERM)])
def test_a_demo_stopped_any_way_leaves_nothing_behind(
        how: str, signum: signal.Signals, tmp_path: Path) -> None:
    """SIGHUP to its process group (a closed terminal) or SIGTERM to it alone (``kill``)
    while it replays: it stops as on Ctrl-C (130), and its redis-server and files are
    gone (Python died on the spot, leaving its temporary directory and its redis-server,
    which ignores SIGHUP, and after a ``kill`` its fairgate serve too)."""
    process = subprocess.Popen(_fairgate("demo", "--pods", "400"), cwd=tmp_path,
                               env=_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stdout:
            seen.append(line)
            if "fairgate serve is up" in line:
                break
        port = re.search(r"Redis at redis://127\.0\.0\.1:(\d+)/0", "".join(seen))
        assert port, "".join(seen)
    finally:
        if signum == signal.SIGHUP:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        rest, _ = process.communicate(timeout=60)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(port.group(1)))) != 0, "redis-server lives"
    assert list(tmp_path.iterdir()) == []

"""``fairgate console --auth kubernetes`` on the real API server: bearer tokens checked with
TokenReview, visibility decided with SubjectAccessReview; a tenant admin never sees
another tenant on any page, API route or the event stream. As in the cluster
(manifests/console.yaml), it listens on every address and serves HTTPS with a certificate
of ``fairgate certs generate``; the tests' clients check it against its CA.

The attacks the console is hardened against, each against this real API server's
identities: a tenant admin guessing another tenant's hidden names through the audit
search, another tenant's namespace, pod and user names in the audit log and the event
stream, the token cookie behind a TLS-terminating proxy, and a flood of half-open
connections. (The webhook's ``/readyz`` is in test_open_endpoints.py.)

Uses its own control namespace (``console-e2e-system``) and redis-server, so it does not
depend on (or disturb) the module that installs fairgate itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
import redis
from harness.api import create_namespace
from harness.controlplane import ControlPlane
from kubernetes import client

from audit import AuditLog
from certs import write_bundle
from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.localdir import load_config_dir, write_config_dir
from tests.webhook.console_helpers import closed_within, open_fds

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CONTROL = "console-e2e-system"
ROUTES = ("/tenants", "/queue", "/fairness", "/audit", "/cost", "/api/tenants",
          "/api/queue", "/api/fairness", "/api/audit", "/api/cost",
          "/api/queue?tenant=team-b", "/api/queue?namespace=team-b-dev",
          "/api/fairness?tenant=team-b", "/api/audit?q=team-b", "/queue?tenant=team-b",
          "/audit?q=team-b")
PLATFORM = """\
platformAdmins: {groups: [platform-team]}
capacity: {gpu: 8}
tenants:
  team-a: {weight: 1, ceiling: {gpuEquivalents: 4}}
  team-b: {weight: 1, ceiling: {gpuEquivalents: 4}}
"""
QUOTAS = {"team-a": "nominal: {gpu: 1}\n", "team-b": "nominal: {gpu: 1}\n"}
REDIS_URLS: dict[str, str] = {}
CONFIG_DIRS: dict[str, Path] = {}
TRUST: dict[str, ssl.SSLContext] = {}  # per console URL: its certificate's CA
# team-a's namespace "lab" does not spell its tenant's name: it is hidden by whom it
# belongs to, not by its spelling.
NAMESPACES = ("team-a-dev: {fairgate.io/tenant: team-a}\nlab: {fairgate.io/tenant: team-a}\n"
              "team-b-dev: {fairgate.io/tenant: team-b}\n")
ACCOUNTS = ("console", "platform", "team-a-admin", "team-b-admin", "nobody")
HIDDEN = "(another tenant)"


def _bind(rbac: Any, role_kind: str, role: str, account: str, name: str) -> None:
    body = {"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": CONTROL}]}
    if role_kind == "ClusterRole":
        rbac.create_cluster_role_binding(body)
    else:
        rbac.create_namespaced_role_binding(CONTROL, body)


def _token(core: Any, account: str) -> str:
    answer = core.create_namespaced_service_account_token(
        account, CONTROL, {"spec": {"expirationSeconds": 3600}})
    token: str = answer.status.token
    return token


@pytest.fixture(scope="module")
def tokens(controlplane: ControlPlane) -> Iterator[dict[str, str]]:
    """ServiceAccounts: ``console`` (TokenReview + SubjectAccessReview via
    system:auth-delegator), ``platform`` (may get every ConfigMap of the control
    namespace), ``team-a-admin`` (may get quota-team-a only), ``team-b-admin``
    (quota-team-b only), ``nobody``."""
    core: Any = client.CoreV1Api(controlplane.admin)
    rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
    create_namespace(core, CONTROL)
    for account in ACCOUNTS:
        core.create_namespaced_service_account(CONTROL, {"metadata": {"name": account}})
    _bind(rbac, "ClusterRole", "system:auth-delegator", "console", "console-e2e-delegator")
    rbac.create_namespaced_role(CONTROL, {
        "metadata": {"name": "read-config"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "verbs": ["get", "list", "watch"]}]})
    for tenant in ("team-a", "team-b"):
        rbac.create_namespaced_role(CONTROL, {
            "metadata": {"name": f"read-quota-{tenant}"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": [f"quota-{tenant}"], "verbs": ["get"]}]})
        _bind(rbac, "Role", f"read-quota-{tenant}", f"{tenant}-admin", f"{tenant}-reads-quota")
    _bind(rbac, "Role", "read-config", "platform", "platform-reads-config")
    yield {account: _token(core, account) for account in ACCOUNTS}
    rbac.delete_cluster_role_binding("console-e2e-delegator")
    core.delete_namespace(CONTROL)


@pytest.fixture(scope="module")
def console(controlplane: ControlPlane, tokens: dict[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Redis holding both tenants' usage, queue and audit records; the console in
    Kubernetes mode authenticated as its ServiceAccount. Yields its base URL (the Redis
    URL is in ``REDIS_URLS[base]``)."""
    work = tmp_path_factory.mktemp("console-e2e")
    config_dir = write_config_dir(work / "config", PLATFORM, QUOTAS, NAMESPACES)
    kubeconfig = controlplane.token_kubeconfig(CONTROL, "console")
    with local_redis() as url:
        seeded = redis.Redis.from_url(url)
        queue = FairQueue(seeded)
        queue.sync_config(load_config_dir(config_dir), {"gpu": 8})
        log = AuditLog(seeded, out=open(os.devnull, "w"))  # noqa: SIM115
        now = time.time()
        for tenant in ("team-a", "team-b"):
            for i in range(3):
                name = f"{tenant}-pod-{i}"
                request = PodRequest(str(uuid.uuid4()), tenant, f"{tenant}-dev", name,
                                     "training", {"gpu": 1}, submitted_at=now + i)
                admission = queue.admit(request, now + i)
                queue.confirm(request.ticket, str(uuid.uuid4()), f"{tenant}-dev", name)
                log.record("queue" if admission.outcome == "queued" else "admit",
                           tenant=tenant, namespace=f"{tenant}-dev", name=name,
                           pod_class="training", demand="gpu=1",
                           reason=f"{tenant} pod {i}")
        process, base = _start(kubeconfig, url, config_dir, work / "console.log")
        try:
            time.sleep(1.5)  # one fairness sample
            REDIS_URLS[base] = url
            CONFIG_DIRS[base] = config_dir
            yield base
        finally:
            process.terminate()
            process.wait(10)
            seeded.close()


def _start(kubeconfig: Path, url: str, config_dir: Path | None, log: Path,
           https: bool = True) -> tuple[subprocess.Popen[str], str]:
    """``fairgate console --auth kubernetes`` as the kubeconfig's identity, with
    ``--config-dir`` unless None (then the config comes from the cluster), on every
    address, over HTTPS with a new certificate for 127.0.0.1 (trusted in ``TRUST``), or
    with ``https`` off over plain HTTP as behind a TLS-terminating proxy
    (``--plain-http``): (process, URL)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": CONTROL,
           "PYTHONPATH": str(REPO)}
    transport = ["--plain-http"]
    if https:
        tls = write_bundle(log.parent / "console-tls", "fairgate-console", CONTROL,
                           ("127.0.0.1",))
        transport = ["--cert-dir", str(tls.cert.parent)]
    process = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "console", "--redis-url", url,
         "--auth", "kubernetes", "--host", "0.0.0.0", "--port", "0", *transport,
         "--sample-every", "1",
         *(["--config-dir", str(config_dir)] if config_dir is not None else [])],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    scheme = "https" if https else "http"
    assert line.startswith(f"console: {scheme}://127.0.0.1:"), log.read_text()
    assert "token=" not in line  # Kubernetes mode: the user brings the token
    base = line.removeprefix("console: ").rstrip("/")
    TRUST[base] = (ssl.create_default_context(cafile=str(tls.ca_cert)) if https
                   else ssl.create_default_context())
    return process, base


def _without_echo(text: str) -> str:
    """A page without the viewer's own filter echoed back (form values, summary line)."""
    text = re.sub(r"<form .*?</form>", "", text, flags=re.S)
    return re.sub(r'<p class="summary">.*?</p>', "", text, flags=re.S)


def _get(base: str, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(base + path, headers=headers, timeout=30, verify=TRUST[base])


def test_a_tenant_admin_sees_its_tenant_and_never_another(
        console: str, tokens: dict[str, str]) -> None:
    for path in ROUTES:
        answer = _get(console, path, tokens["team-a-admin"])
        assert answer.status_code == 200, (path, answer.text)
        assert "team-b" not in _without_echo(answer.text), path
    tenants = _get(console, "/api/tenants", tokens["team-a-admin"]).json()["tenants"]
    assert [t["name"] for t in tenants] == ["team-a"]
    queue = _get(console, "/api/queue", tokens["team-a-admin"]).json()
    assert {r["tenant"] for r in queue["rows"]} == {"team-a"}
    assert queue["total"] == 2
    audit = _get(console, "/api/audit", tokens["team-a-admin"]).json()["records"]
    assert {r["tenant"] for r in audit} == {"team-a"} and len(audit) == 3


def test_a_platform_admin_sees_every_tenant(console: str, tokens: dict[str, str]) -> None:
    tenants = _get(console, "/api/tenants", tokens["platform"]).json()["tenants"]
    assert [t["name"] for t in tenants] == ["team-a", "team-b"]
    assert _get(console, "/api/queue", tokens["platform"]).json()["total"] == 4
    assert "team-b" in _get(console, "/queue", tokens["platform"]).text


def test_no_token_a_bad_token_or_no_rights_are_refused_everywhere(
        console: str, tokens: dict[str, str]) -> None:
    for path in (*ROUTES, "/api/events", "/static/console.css"):
        assert _get(console, path, None).status_code == 401, path
        bad = _get(console, path, "not-a-token")
        assert bad.status_code == 401, path
        assert "TokenReview" in bad.text
        none = _get(console, path, tokens["nobody"])
        assert none.status_code == 403, path
        assert "team-" not in none.text.replace("quota-<tenant>", "")


def _record(base: str, *records: dict[str, Any]) -> None:
    """Append ``records`` (``decision`` plus AuditRecord fields) to the console's audit
    log, as fairgate serve and dispatch do."""
    seeded = redis.Redis.from_url(REDIS_URLS[base])
    log = AuditLog(seeded, out=open(os.devnull, "w"))  # noqa: SIM115
    for fields in records:
        log.record(**fields)
    seeded.close()


def _events_while(base: str, token: str, *records: dict[str, Any]) -> list[dict[str, Any]]:
    """The decisions the event stream sends ``token``'s user while ``records`` are
    appended, up to the first event of the last record's pod (or 20 s)."""
    last = f"{records[-1]['namespace']}/{records[-1]['name']}"
    seen: list[dict[str, Any]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", base + "/api/events", timeout=20, verify=TRUST[base],
                          headers={"Authorization": f"Bearer {token}"}) as events:
            for line in events.iter_lines():
                if line == ": connected":
                    ready.set()
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["pod"] == last:
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(20)
    time.sleep(1.5)  # the producer starts reading at the stream's end
    _record(base, *records)
    listener.join(20)
    assert seen and seen[-1]["pod"] == last, seen
    return seen


def test_the_event_stream_carries_only_the_tenant_admins_tenant(
        console: str, tokens: dict[str, str]) -> None:
    seen = _events_while(
        console, tokens["team-a-admin"],
        {"decision": "queue", "tenant": "team-b", "namespace": "team-b-dev",
         "name": "secret-b", "reason": "team-b waits"},
        {"decision": "queue", "tenant": "team-a", "namespace": "team-a-dev",
         "name": "live-a", "reason": "capacity held for team-b-dev/secret-b"})
    assert all(event["tenant"] == "team-a" for event in seen)
    assert "team-b" not in json.dumps(seen)
    assert "(another tenant)" in seen[-1]["reason"]


def _reviews(controlplane: ControlPlane) -> float:
    """TokenReviews plus SubjectAccessReviews the API server has answered so far (its
    ``apiserver_request_total`` counters)."""
    response = controlplane.admin.call_api("GET", controlplane.url + "/metrics")
    assert response.status == 200, response.reason
    total = 0.0
    for line in response.response.data.decode().splitlines():
        if line.startswith("apiserver_request_total{") and (
                'resource="tokenreviews"' in line or 'resource="subjectaccessreviews"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_access_is_cached_so_pages_cost_no_review_while_warm(
        console: str, tokens: dict[str, str], controlplane: ControlPlane) -> None:
    """Decisions are cached (30 s): once a user's token and tenants are decided, every
    page and API route is answered without asking the API server again."""
    assert _get(console, "/api/tenants", tokens["team-a-admin"]).status_code == 200
    before = _reviews(controlplane)
    assert before > 0
    for route in ROUTES:
        assert _get(console, route, tokens["team-a-admin"]).status_code == 200, route
    assert _reviews(controlplane) == before
    # the count does move: a rejected token is not cached, so each one is reviewed
    assert _get(console, "/api/tenants", "not-a-token").status_code == 401
    assert _reviews(controlplane) == before + 1


def test_a_console_that_may_not_review_tokens_says_so_never_500(
        console: str, tokens: dict[str, str], controlplane: ControlPlane,
        tmp_path: Path) -> None:
    kubeconfig = controlplane.token_kubeconfig(CONTROL, "nobody")
    process, base = _start(kubeconfig, REDIS_URLS[console], CONFIG_DIRS[console],
                           tmp_path / "console.log")
    try:
        answer = _get(base, "/api/tenants", tokens["platform"])
    finally:
        process.terminate()
        process.wait(10)
    assert answer.status_code == 503
    assert "tokenreviews" in answer.json()["error"]


def test_without_a_config_dir_the_console_reads_the_config_from_the_cluster(
        console: str, tokens: dict[str, str], controlplane: ControlPlane,
        tmp_path: Path) -> None:
    """The platform and quota ConfigMaps in the control namespace give the ceilings; the
    console's ServiceAccount reads them with the reads manifests/console.yaml grants."""
    core: Any = client.CoreV1Api(controlplane.admin)
    rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
    core.create_namespaced_config_map(CONTROL, {
        "metadata": {"name": "fairgate-platform"},
        "data": {"platform.yaml": PLATFORM.replace("gpuEquivalents: 4}}\n",
                                                   "gpuEquivalents: 3}}\n", 1)}})
    for tenant, quota in QUOTAS.items():
        core.create_namespaced_config_map(CONTROL, {
            "metadata": {"name": f"quota-{tenant}", "labels": {"fairgate.io/quota": tenant}},
            "data": {"quota.yaml": quota}})
    _bind(rbac, "Role", "read-config", "console", "console-reads-config")
    rbac.create_cluster_role({"metadata": {"name": "console-e2e-namespaces"}, "rules": [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]})
    _bind(rbac, "ClusterRole", "console-e2e-namespaces", "console", "console-e2e-namespaces")
    kubeconfig = controlplane.token_kubeconfig(CONTROL, "console")
    process, base = _start(kubeconfig, REDIS_URLS[console], None, tmp_path / "console.log")
    try:
        deadline = time.monotonic() + 30
        ceilings: dict[str, Any] = {}
        while time.monotonic() < deadline:
            rows = _get(base, "/api/tenants", tokens["platform"]).json()["tenants"]
            ceilings = {r["name"]: r["ceiling"] for r in rows}
            if all(ceilings.values()):
                break
            time.sleep(0.5)
    finally:
        process.terminate()
        process.wait(10)
        rbac.delete_cluster_role_binding("console-e2e-namespaces")
        rbac.delete_cluster_role("console-e2e-namespaces")
    assert ceilings == {"team-a": 3.0, "team-b": 4.0}, (tmp_path / "console.log").read_text()


# -- the attacks (docs/security.md, "The console and the webhook's open endpoints") ------

# What team-a owns, spelled unlike its tenant: the namespace "lab", its pod "p-secret", its
# ServiceAccount's user name. None of it may reach team-b's admin.
TEAM_A_SECRETS = ("team-a", "lab", "p-secret", "system:serviceaccount:lab:trainer")


def _audit_as(base: str, token: str, q: str = "") -> dict[str, Any]:
    """``/api/audit?q=`` as the holder of ``token``, without the chain's check time."""
    answer = _get(base, "/api/audit?limit=1000" + (f"&q={quote(q)}" if q else ""), token)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    body["chain"].pop("checkedAt", None)
    return body


def test_guesses_of_a_hidden_name_in_the_audit_search_get_identical_answers(
        console: str, tokens: dict[str, str]) -> None:
    """The attack: team-b's admin is shown its record as "capacity held for (another
    tenant)" and searches for guesses of the hidden words, letter by letter. A right
    guess and a wrong one get the same answer: nothing; the shown text is found."""
    reason = "capacity held for team-a-dev/a-secret of team-a"
    _record(console, {"decision": "queue", "tenant": "team-b", "namespace": "team-b-dev",
                      "name": "b-held", "reason": reason})
    team_b = tokens["team-b-admin"]
    [held] = [r for r in _audit_as(console, team_b)["records"] if r["name"] == "b-held"]
    assert held["reason"] == f"capacity held for {HIDDEN} of {HIDDEN}"
    wrong = _audit_as(console, team_b, "capacity held for x")
    assert wrong["records"] == []
    for guess in ("capacity held for t", "capacity held for te", "capacity held for team-a-",
                  "capacity held for team-a-dev/a-secret", "team-a-dev/a", "a-secret",
                  "of team-a", "of t", "held for team"):
        assert _audit_as(console, team_b, guess) == wrong, guess
    assert _audit_as(console, team_b, f"held for {HIDDEN}")["records"] == [held]
    everything = _audit_as(console, tokens["platform"], "held for team-a-dev/a")["records"]
    assert [r["reason"] for r in everything] == [reason]  # the record is there, in full


def test_another_tenants_namespace_pod_and_user_names_never_reach_the_audit_or_the_stream(
        console: str, tokens: dict[str, str]) -> None:
    """team-b records whose reason and quota diff name team-a, its namespace "lab" (which
    does not spell team-a), its pod and its ServiceAccount: team-b's admin gets them with
    each of those words hidden, in /api/audit and on the event stream; the platform
    admin reads them as written."""
    records = (
        {"decision": "queue", "tenant": "team-b", "namespace": "team-b-dev", "name": "b-1",
         "reason": "capacity held for lab/p-secret"},
        {"decision": "quota-change", "tenant": "team-b", "namespace": CONTROL,
         "name": "quota-team-b", "reason": "namespace lab lends to team-b",
         "diff": {"lab": {"old": ["system:serviceaccount:lab:trainer", 1], "new": 2}}},
        {"decision": "admit", "tenant": "team-b", "namespace": "team-b-dev", "name": "b-2",
         "reason": "after system:serviceaccount:lab:trainer released team-a/training"},
    )
    seen = _events_while(console, tokens["team-b-admin"], *records)
    shown = _audit_as(console, tokens["team-b-admin"])["records"]
    mine = [r for r in shown if r["name"] in ("b-1", "quota-team-b", "b-2")]
    assert len(mine) == 3 and {e["pod"].rsplit("/", 1)[1] for e in seen} >= {"b-1", "b-2"}
    for secret in TEAM_A_SECRETS:
        assert secret not in json.dumps(shown), (secret, mine)
        assert secret not in json.dumps(seen), (secret, seen)
    assert HIDDEN in json.dumps(mine) and HIDDEN in json.dumps(seen)
    everything = json.dumps(_audit_as(console, tokens["platform"])["records"])
    assert all(secret in everything for secret in TEAM_A_SECRETS)


def _login(base: str, token: str, source: str, **headers: str) -> list[str]:
    """The Set-Cookie of a first visit with ``?token=``, sent from address ``source``:
    its attributes, lower-cased."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as browser:
        answer = browser.get(f"{base}/tenants", params={"token": token}, headers=headers)
    assert answer.status_code == 303, answer.text
    return [part.strip().lower() for part in answer.headers["set-cookie"].split(";")]


def test_the_token_cookie_is_secure_behind_a_tls_terminating_proxy(
        console: str, tokens: dict[str, str], controlplane: ControlPlane,
        tmp_path: Path) -> None:
    """--plain-http: a proxy ends TLS and reaches the console over http. Whether the proxy
    is trusted for X-Forwarded-Proto (127.0.0.1, the default) or not (127.0.0.2), and
    with no such header, the cookie carrying the user's Kubernetes token is Secure,
    HttpOnly and SameSite=Strict: browsers never send it back over plain http."""
    kubeconfig = controlplane.token_kubeconfig(CONTROL, "console")
    process, base = _start(kubeconfig, REDIS_URLS[console], CONFIG_DIRS[console],
                           tmp_path / "console.log", https=False)
    port = urlsplit(base).port
    token = tokens["team-b-admin"]
    try:
        for source, headers in (("127.0.0.1", {"X-Forwarded-Proto": "https"}),
                                ("127.0.0.2", {"X-Forwarded-Proto": "https"}),
                                ("127.0.0.1", {"X-Forwarded-Proto": "http"}),
                                ("127.0.0.2", {})):
            cookie = _login(f"http://127.0.0.1:{port}", token, source, **headers)
            assert cookie[0] == f"fairgate_console={token}".lower()
            assert {"secure", "httponly", "samesite=strict"} <= set(cookie), (source, headers)
    finally:
        process.terminate()
        process.wait(10)


FLOOD = 2000
CAP, REQUEST_SECONDS = 512, 10.0  # fairgate console's defaults (docs/console.md)
HALF_SENT = b"GET /api/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def test_2000_half_open_connections_are_bounded_while_a_user_is_served(
        console: str, tokens: dict[str, str], controlplane: ControlPlane,
        tmp_path: Path) -> None:
    """2,000 TLS connections that send half a request and stop, against a console with
    its default limits: beyond 512 open they are refused with a 503 saying so, the
    console's descriptors stay at the cap, every one is closed within the request timeout
    (10 s) of the flood's end, and a user already connected is served throughout, a new
    one right after."""
    kubeconfig = controlplane.token_kubeconfig(CONTROL, "console")
    process, base = _start(kubeconfig, REDIS_URLS[console], CONFIG_DIRS[console],
                           tmp_path / "console.log")
    user = httpx.Client(base_url=base, timeout=30, verify=TRUST[base],
                        headers={"Authorization": f"Bearer {tokens['team-b-admin']}"})
    served: list[int] = []
    stop = threading.Event()

    def browse() -> None:
        while not stop.is_set():
            served.append(user.get("/api/tenants").status_code)
            stop.wait(0.3)

    socks: list[ssl.SSLSocket] = []
    try:
        assert user.get("/api/tenants").status_code == 200  # connected before the flood
        before = open_fds(process.pid)
        browsing = threading.Thread(target=browse, daemon=True)
        browsing.start()
        parts = urlsplit(base)
        for _ in range(FLOOD):
            raw = socket.create_connection((parts.hostname, parts.port), timeout=30)
            sock = TRUST[base].wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(HALF_SENT)
            socks.append(sock)
        flooded = time.monotonic()
        time.sleep(2)  # refused ones are read for a second, so that the 503 arrives
        assert open_fds(process.pid) <= before + CAP + 10
        closed, answers = closed_within(socks, flooded + REQUEST_SECONDS + 5
                                        - time.monotonic())
        assert closed == FLOOD, f"{FLOOD - closed} still open {REQUEST_SECONDS + 5:g} s after"
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= FLOOD - 2 * CAP, len(refused)
        assert all(b"too many connections" in a for a in refused)
        stop.set()
        browsing.join(30)
        assert served and set(served) == {200}, served
        with httpx.Client(base_url=base, timeout=30, verify=TRUST[base]) as newcomer:
            answer = newcomer.get("/api/tenants", headers={
                "Authorization": f"Bearer {tokens['team-b-admin']}"})
        assert answer.status_code == 200
        assert open_fds(process.pid) <= before + 10
    finally:
        stop.set()
        for sock in socks:
            sock.close()
        user.close()
        process.terminate()
        process.wait(10)

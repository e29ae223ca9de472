"""``fairgate demo``: the webhook and the dispatcher at work on this machine, no cluster.

Contract: :func:`run_demo` starts a ``redis-server`` that requires a random password,
so the demo takes the same authenticated path as a cluster install (unless a Redis is
given: it must hold no ``fairgate:`` keys, so a live deployment is never touched, and
the demo's keys are deleted at the end), writes a CA and
serving certificate and an embedded three-tenant config into a temporary directory,
runs ``fairgate serve`` as a child process over HTTPS on loopback, and replays a
deterministic, realistic stream of pods on a simulated cluster
(:class:`~fairshare.sim.simcluster.SimulatedCluster`, virtual clock): every pod creation is
a real AdmissionReview v1 sent over HTTPS (verified against the generated CA), the
answer's JSON Patch decides the pod's ticket, priority band and gate, and the real
:class:`~fairshare.dispatcher.Dispatcher` releases gated pods as running pods finish.
It shows progress, then per tenant what was admitted at once, queued, denied and
released later, with wait times per class, verifies the audit chain, shows the cost table
billed from it (:mod:`cost.billing`, the window of ``fairgate report``: this month up to
now) and ends saying how long it took. The virtual clock starts :data:`HORIZON` before the
real start and the pods run to their end up to now, so no record lies in the future and
``fairgate report`` and the console bill the same. Over the run it writes the fairness
samples the console would have taken (every :data:`SAMPLE_EVERY` virtual seconds,
:class:`~webhook.console.history.FairnessHistory`), so the console's Fairness page shows
the run. It prints how to point other commands at its Redis. With
``web_console`` (``fairgate demo --console``) it then keeps everything running and serves
``fairgate console`` on it (its ``console: <url>`` line printed) until Ctrl-C. Everything it
started or wrote on disk is removed at the end, also when the demo is stopped by Ctrl-C
(its ``redis-server`` is not in the terminal's process group, so it outlives the console
until the demo stops it), and by SIGTERM or SIGHUP (the terminal closed), which it takes
as Ctrl-C (exit code 130). The webhook runs on the demo's virtual clock too (it reads
the time the demo writes before each request): every audit record, the webhook's
``admit``, ``queue`` and ``deny`` as the dispatcher's ``dispatch``, ``start`` and
``release``, is on that one clock. Exit code 0 when every request got a valid answer, 1
otherwise (the server's log is shown).
"""

from __future__ import annotations

import base64
import io
import json
import math
import random
import secrets
import signal
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import jsonpatch
import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from audit import AuditLog
from certs import write_bundle
from cost.billing import bill
from cost.report import bill_tables, idle_line, window
from fairshare.connection import RedisTarget, connect_redis
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from fairshare.sim.simcluster import Placement, PodSpec, SimulatedCluster, VirtualClock
from tenants import resources
from tenants.localdir import load_config_dir, write_config_dir
from tenants.models import (
    CLASS_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_GATE,
    TICKET_ANNOTATION,
    FairgateConfig,
    PodClass,
)
from tenants.tables import tenant_table
from webhook.console.history import FairnessHistory
from webhook.process import ServeProcess

PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team], users: []}
capacity: {gpu: 10, mig-1g.5gb: 14, mig-3g.20gb: 2}
tenants:
  team-a:
    weight: 3
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-a-admins], users: [alice@example.com]}
  team-b:
    weight: 2
    ceiling: {gpuEquivalents: 6}
    admins: {groups: [team-b-admins]}
  team-c:
    weight: 1
    ceiling: {gpuEquivalents: 4}
    admins: {users: [carol@example.com]}
    classes: [inference]
onRedisUnavailable: deny
pricing: {currency: USD, gpuHour: {default: 2.50, NVIDIA-A100-SXM4-80GB: 3.10}}
"""

QUOTAS = {
    "team-a": """\
nominal: {gpu: 4, mig-1g.5gb: 7}
borrowLimit: {gpuEquivalents: 2}
inferenceReserve: {gpuEquivalents: 1}
defaultClass: training
""",
    "team-b": """\
nominal: {gpu: 5}
borrowLimit: {gpuEquivalents: 1}
inferenceReserve: {gpuEquivalents: 3}
defaultClass: training
""",
    "team-c": """\
nominal: {mig-1g.5gb: 7, mig-3g.20gb: 2}
defaultClass: inference
""",
}

NAMESPACES_YAML = """\
team-a-prod: {fairgate.io/tenant: team-a}
team-a-research: {fairgate.io/tenant: team-a}
team-b-ml: {fairgate.io/tenant: team-b}
team-c-serving: {fairgate.io/tenant: team-c}
sandbox: {}
"""

NO_TENANT = "(no tenant)"
KEY_PREFIX = "fairgate:"
SAMPLE_EVERY = 60.0
"""Virtual seconds between the fairness samples the demo writes for the console."""


def write_demo_config(directory: Path) -> FairgateConfig:
    """Write the demo's config files into ``directory`` and return the loaded config."""
    return load_config_dir(write_config_dir(directory, PLATFORM_YAML, QUOTAS, NAMESPACES_YAML))


@dataclass(frozen=True)
class DemoPod:
    """One pod of the demo stream: what a user or controller creates."""

    namespace: str
    name: str
    demand: Mapping[str, int]
    duration: float = 300.0
    pod_class: str | None = None
    owner_kind: str | None = None
    group: tuple[str, int] | None = None

    def manifest(self) -> dict[str, Any]:
        """The pod as the API server would send it."""
        limits = {resources.k8s_name(r): str(n) for r, n in self.demand.items()}
        labels: dict[str, str] = {"app": self.name.split("-", 1)[0]}
        annotations: dict[str, str] = {}
        if self.pod_class:
            labels[CLASS_LABEL] = self.pod_class
        if self.group:
            labels[POD_GROUP_LABEL] = self.group[0]
            annotations[POD_GROUP_SIZE_ANNOTATION] = str(self.group[1])
        metadata: dict[str, Any] = {
            "name": self.name, "namespace": self.namespace, "labels": labels,
        }
        if annotations:
            metadata["annotations"] = annotations
        if self.owner_kind:
            metadata["ownerReferences"] = [{
                "apiVersion": "apps/v1" if self.owner_kind == "ReplicaSet" else "batch/v1",
                "kind": self.owner_kind, "name": labels["app"], "uid": str(uuid.uuid4()),
                "controller": True,
            }]
        container: dict[str, Any] = {
            "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"limits": {"cpu": "4", "memory": "16Gi", **limits}},
        }
        return {
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [container], "restartPolicy": "Never"},
        }


def admission_review(pod: Mapping[str, Any], uid: str, *, dry_run: bool = False) -> dict[str, Any]:
    """A pod CREATE AdmissionReview v1, as the API server sends it."""
    metadata = pod["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": metadata.get("name", ""),
            "namespace": metadata["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def demo_stream(total: int, seed: int = 7) -> list[DemoPod]:
    """A deterministic mixed stream of about ``total`` pods (gangs kept whole).

    Durations are virtual seconds: inference replicas are short-lived here so that the
    demo shows them coming and going; training runs for minutes.
    """
    rng = random.Random(seed)

    def minutes(low: int, high: int) -> float:
        return float(rng.randint(low, high) * 60)

    kinds: list[tuple[int, Any]] = [
        # (weight, factory(i) -> list of pods)
        (5, lambda i: [DemoPod("team-a-prod", f"chat-{i}", {"mig-1g.5gb": 1}, minutes(1, 3),
                               "inference", "ReplicaSet")]),
        (6, lambda i: [DemoPod("team-a-research", f"pretrain-{i}", {"gpu": 1}, minutes(5, 15),
                               owner_kind="Job")]),
        (1, lambda i: [DemoPod("team-a-research", f"ddp{i}-{m}", {"gpu": 1}, 600.0, "training",
                               "Job", (f"ddp{i}", 4)) for m in range(4)]),
        (4, lambda i: [DemoPod("team-b-ml", f"finetune-{i}", {"gpu": 2}, minutes(5, 12),
                               owner_kind="Job")]),
        (3, lambda i: [DemoPod("team-b-ml", f"embed-{i}", {"gpu": 1},
                               float(rng.randint(30, 90)), "inference", "ReplicaSet")]),
        (1, lambda i: [DemoPod("team-b-ml", f"huge-{i}", {"gpu": 6}, 60.0, "inference")]),
        (4, lambda i: [DemoPod("team-c-serving", f"asr-{i}", {"mig-1g.5gb": 1}, minutes(1, 3),
                               owner_kind="ReplicaSet")]),
        (2, lambda i: [DemoPod("team-c-serving", f"rerank-{i}", {"mig-3g.20gb": 1},
                               minutes(1, 3), "inference", "ReplicaSet")]),
        (1, lambda i: [DemoPod("team-c-serving", f"train-{i}", {"gpu": 1}, 600.0, "training",
                               "Job")]),
        (3, lambda i: [DemoPod("sandbox", f"notebook-{i}", {"gpu": 1})]),
        (2, lambda i: [DemoPod("team-a-prod", f"web-{i}", {})]),
    ]
    weights = [w for w, _ in kinds]
    pods: list[DemoPod] = []
    i = 0
    while len(pods) < total:
        _, make = rng.choices(kinds, weights)[0]
        pods.extend(make(i))
        i += 1
    return pods


class DemoError(RuntimeError):
    """The webhook answered something that is not a valid admission response."""


class Denied(Exception):
    """The webhook refused a pod (the API server would not create it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WebhookClient:
    """Sends pod CREATEs to the webhook and turns answers into placements."""

    def __init__(self, client: httpx.Client, config: FairgateConfig,
                 clock_file: Path | None = None) -> None:
        """Talk through ``client`` (TLS verified); read priority classes from ``config``;
        tell the webhook the time through ``clock_file`` (its ``--clock-file``)."""
        self.client = client
        self.priority_classes = config.platform.priority_classes
        self.clock_file = clock_file
        self.clock: Callable[[], float] = time.time
        self.sent = 0

    def follow(self, clock: Callable[[], float]) -> None:
        """Send each request at ``clock``'s time: the webhook queues and audits on it."""
        self.clock = clock
        self._tell_time()

    def _tell_time(self) -> None:
        if self.clock_file is not None:
            written = self.clock_file.with_suffix(".new")
            written.write_text(repr(self.clock()), encoding="ascii")
            written.replace(self.clock_file)  # atomic: never read half written

    def create(self, pod: DemoPod) -> tuple[PodClass, Placement] | None:
        """Admit ``pod``: its class and placement; None when it asks for no GPU.

        Raises :class:`Denied` when the webhook refuses it, :class:`DemoError` when the
        answer is not a valid AdmissionReview response.
        """
        manifest = pod.manifest()
        uid = str(uuid.uuid4())
        self._tell_time()
        reply = self.client.post("/mutate", json=admission_review(manifest, uid))
        self.sent += 1
        if reply.status_code != 200:
            raise DemoError(f"/mutate answered HTTP {reply.status_code} for "
                            f"{pod.namespace}/{pod.name}: {reply.text[:300]}")
        answer = reply.json()
        response = answer.get("response")
        if answer.get("kind") != "AdmissionReview" or not isinstance(response, dict) \
                or response.get("uid") != uid:
            raise DemoError(f"invalid answer for {pod.namespace}/{pod.name}: {answer}")
        if not response["allowed"]:
            raise Denied(response.get("auditAnnotations", {}).get("reason", "denied"))
        if not response.get("patch"):
            return None
        ops = json.loads(base64.b64decode(response["patch"]))
        stamped = jsonpatch.apply_patch(manifest, ops)
        band = self.priority_classes.band_of(stamped["spec"]["priorityClassName"])
        if band is None:
            raise DemoError(f"unknown priority class in the patch for {pod.name}")
        gated = {"name": QUEUE_GATE} in stamped["spec"].get("schedulingGates", [])
        pod_class: PodClass = "inference" if band == "inference" else "training"
        ticket = stamped["metadata"]["annotations"][TICKET_ANNOTATION]
        return pod_class, Placement(ticket, band, gated)


@dataclass
class TenantTally:
    """What happened to one tenant's pods."""

    weight: float = 0.0
    nominal_slices: int = 0
    admitted: int = 0
    queued: int = 0
    denied: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    released: int = 0
    waits: dict[str, list[float]] = field(default_factory=dict)
    slice_seconds: float = 0.0


class DemoCluster:
    """The simulated cluster, the dispatcher and the webhook, driven on a virtual clock."""

    def __init__(self, webhook: WebhookClient, config: FairgateConfig, client: redis.Redis,
                 start: float) -> None:
        """Run against Redis ``client`` (fairgate's default keys) from virtual ``start``."""
        self.webhook = webhook
        self.config = config
        self.clock = VirtualClock(start)
        webhook.follow(self.clock)
        self.cluster = SimulatedCluster(dict(config.platform.capacity), self._admit, self.clock)
        self.dispatcher = Dispatcher(
            FairQueue(client), self.cluster, lambda: config, clock=self.clock,
            audit=AuditLog(client, out=io.StringIO()),
            settings=DispatcherSettings(reconcile_every=math.inf, queued_events_per_pass=0),
        )
        self.tallies = {t.name: TenantTally(t.weight, t.nominal_slices) for t in config.tenants()}
        self.history = FairnessHistory(client, FairQueue(client), interval=SAMPLE_EVERY)
        self._next_sample = start
        self.dispatcher.step()  # as at any start: sync the config, rebuild from the cluster
        self._prepared: dict[tuple[str, str], Placement] = {}
        self._pods: dict[tuple[str, str], DemoPod] = {}
        self.created = 0  # pods of the stream created (each one AdmissionReview)
        self.without_gpu = 0  # of those, asking for no GPU: allowed untouched, not tallied
        self.recreated = 0  # preempted pods created again by their controller

    def _tally(self, namespace: str) -> TenantTally:
        tenant = self.config.tenant_of_namespace(namespace) or NO_TENANT
        return self.tallies.setdefault(tenant, TenantTally())

    def _admit(self, spec: PodSpec, _uid: str) -> Placement:
        """The cluster's admission hook: the placement the webhook gave this pod."""
        prepared = self._prepared.pop((spec.namespace, spec.name), None)
        if prepared is not None:
            return prepared
        # Re-created by its controller after a preemption: a new admission request.
        self.recreated += 1
        pod = DemoPod(spec.namespace, spec.name, spec.demand, spec.duration, spec.pod_class,
                      group=(spec.group, spec.group_size) if spec.group else None)
        answer = self.webhook.create(pod)
        if answer is None:
            raise DemoError(f"re-created pod {spec.name} lost its GPU demand")
        return answer[1]

    def create(self, pod: DemoPod) -> None:
        """A user creates ``pod``: admission over HTTPS, then the simulated API server."""
        self.created += 1
        try:
            answer = self.webhook.create(pod)
        except Denied as denied:
            tally = self._tally(pod.namespace)
            tally.denied += 1
            tally.reasons[denied.reason] = tally.reasons.get(denied.reason, 0) + 1
            return
        if answer is None:
            self.without_gpu += 1
            return  # no GPU: not fairgate's business
        pod_class, placement = answer
        tally = self._tally(pod.namespace)
        if placement.gated:
            tally.queued += 1
        else:
            tally.admitted += 1
        tenant = self.config.tenant_of_namespace(pod.namespace) or NO_TENANT
        spec = PodSpec(
            namespace=pod.namespace, name=pod.name, tenant=tenant, pod_class=pod_class,
            demand=dict(pod.demand), duration=pod.duration,
            group=pod.group[0] if pod.group else None,
            group_size=pod.group[1] if pod.group else 1,
        )
        self._prepared[(spec.namespace, spec.name)] = placement
        self.cluster.create_pod(spec)

    def settle(self) -> None:
        """Let the dispatcher work until the cluster is quiet."""
        for _ in range(1000):
            result = self.dispatcher.step()
            if not result.released and not result.requeued and not self.cluster.has_changes():
                return
        raise DemoError("the dispatcher did not settle")

    def advance_to(self, when: float) -> None:
        """Finish every pod due by ``when``, dispatching after each completion."""
        while True:
            due = self.cluster.next_completion()
            if due is None or due > when:
                break
            self._meter(due)
            self._sample(due)
            self.clock.advance_to(due)
            self.cluster.advance()
            self.settle()
        self._meter(when)
        self._sample(when)
        self.clock.advance_to(when)

    def _sample(self, until: float) -> None:
        """The fairness samples due up to ``until``: nothing changes between two events,
        so each is the state now."""
        while self._next_sample <= until:
            self.history.sample(self._next_sample)
            self._next_sample += SAMPLE_EVERY

    def _meter(self, until: float) -> None:
        elapsed = until - self.clock()
        if elapsed <= 0:
            return
        for pod in self.cluster.list_pods():
            if pod.phase == "Running":
                self.tallies[pod.tenant].slice_seconds += \
                    elapsed * resources.total_slices(pod.demand)

    def waiting(self) -> int:
        """Pods created but not started yet."""
        return sum(1 for h in self.cluster.history.values()
                   if h.started is None and h.ended is None)

    def finish(self, horizon: float) -> None:
        """Run completions until nothing waits (or ``horizon``), then gather waits."""
        while self.waiting() and self.clock() < horizon:
            due = self.cluster.next_completion()
            if due is None:
                break
            self.advance_to(min(due, horizon))
        for history in self.cluster.history.values():
            tally = self.tallies[history.spec.tenant]
            if history.released is not None and history.released > history.created:
                tally.released += 1
            started = history.started if history.started is not None else self.clock()
            tally.waits.setdefault(history.spec.pod_class, []).append(started - history.created)


def _wait(waits: Mapping[str, list[float]], pod_class: str) -> str:
    values = waits.get(pod_class)
    if not values:
        return "-"
    return f"{statistics.median(values):.0f}/{max(values):.0f}"


def tenant_tables(tallies: Mapping[str, TenantTally]) -> tuple[Table, Table]:
    """The per-tenant results as two tables that fit 80 columns: the pods (quota,
    admitted, queued, denied, released), then the GPU time used and the waits."""
    pods = tenant_table("pods per tenant", ("tenant", "weight", "nominal", "admitted",
                                            "queued", "denied", "released"),
                        caption="nominal: quota in GPU-eq (7 compute slices); admitted: at "
                        "once; queued: behind the gate; released: later, by the dispatcher")
    use = tenant_table("GPU time and waits per tenant",
                       ("tenant", "GPU-eq h", "inference wait", "training wait"),
                       caption="GPU-eq h: GPU-equivalent hours used; wait: from creation to "
                       "start, virtual s, median/max")
    for name in sorted(tallies):
        t = tallies[name]
        pods.add_row(
            name,
            f"{t.weight:g}" if t.weight else "-",
            resources.gpu_equivalents(t.nominal_slices) if t.weight else "-",
            str(t.admitted), str(t.queued), str(t.denied), str(t.released),
        )
        use.add_row(name, f"{t.slice_seconds / resources.SLICES_PER_GPU / 3600:.2f}",
                    _wait(t.waits, "inference"), _wait(t.waits, "training"))
    return pods, use


def _reasons(tallies: Mapping[str, TenantTally]) -> str:
    lines = [f"  {name}: " + ", ".join(f"{r} x{n}" for r, n in sorted(t.reasons.items()))
             for name, t in sorted(tallies.items()) if t.reasons]
    return "denials (audit reason):\n" + "\n".join(lines) if lines else "no denials"


def _asked(asked: int, created: int) -> str:
    """Why ``created`` pods and not the ``asked`` ones of ``--pods`` (nothing if equal)."""
    return "" if created == asked else f" ({asked} asked; the last gang is kept whole)"


def _created_label(asked: int, created: int) -> str:
    """The progress bar's label: the pods it counts."""
    return "pods created through the webhook" + _asked(asked, created)


def _counts(demo: DemoCluster, asked: int) -> str:
    """How the pods created add up to the table's rows (admitted + queued + denied)."""
    tallied = sum(t.admitted + t.queued + t.denied for t in demo.tallies.values())
    return (f"{demo.created} pods created{_asked(asked, demo.created)}: {tallied} GPU pods "
            f"in the table + {demo.without_gpu} without a GPU (let through untouched)")


class DemoRefused(RuntimeError):
    """The demo will not run against this Redis; the message says why."""


@contextmanager
def _redis(given: RedisTarget | str | None) -> Iterator[RedisTarget]:
    """A Redis for the demo: a private one with a random password, or ``given`` if it
    holds no fairgate state."""
    if not given:
        password = secrets.token_urlsafe(24)
        with local_redis(password=password) as started:
            yield RedisTarget(started, password)
        return
    target = RedisTarget.of(given)
    client = connect_redis(target, timeout=5)
    if next(client.scan_iter(match=f"{KEY_PREFIX}*", count=1000), None) is not None:
        client.close()
        raise DemoRefused(
            f"{target} already holds fairgate keys ({KEY_PREFIX}*): the demo would change "
            "them; point REDIS_URL at an empty Redis or database (e.g. .../15), or unset "
            "it to let the demo start its own redis-server"
        )
    try:
        yield target
    finally:  # remove what the demo wrote (the Redis held no fairgate keys before)
        keys = list(client.scan_iter(match=f"{KEY_PREFIX}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()


def redis_env(target: RedisTarget) -> str:
    """The environment that points a ``fairgate`` command at ``target``: ``REDIS_URL``
    (without the password) and ``REDIS_PASSWORD`` when there is one."""
    url, password = target.apart()
    return f"REDIS_URL={url}" + (f" REDIS_PASSWORD={password}" if password else "")


@contextmanager
def _hangup_and_term_as_ctrl_c() -> Iterator[None]:
    """While inside, SIGHUP and SIGTERM do what Ctrl-C does (SIGINT's handler: the
    console's graceful stop, else KeyboardInterrupt; once: more of them are ignored while
    the demo cleans up), so what the demo started is stopped and what it wrote removed (by
    default Python dies on them at once). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = (signal.SIGHUP, signal.SIGTERM)

    def stop(_signum: int, frame: FrameType | None) -> None:
        for each in stopping:
            signal.signal(each, signal.SIG_IGN)
        ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(ctrl_c):  # SIGINT ignored (a background job) or not Python's
            raise KeyboardInterrupt
        ctrl_c(signal.SIGINT, frame)

    previous = {each: signal.signal(each, stop) for each in stopping}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


ARRIVAL_GAP = 5.0  # virtual seconds between pod creations
HORIZON = 4 * 3600.0  # virtual seconds the demo runs at most


def run_demo(redis_url: RedisTarget | str | None = None, pods: int = 120,
             console: Console | None = None, web_console: bool = False,
             console_port: int = 8080) -> int:
    """Run the demo (see the module contract); returns the exit code. With
    ``web_console``, keep the stack up after the table and serve ``fairgate console``
    on it (``console_port``, or any free port when that one is taken) until Ctrl-C."""
    began = time.monotonic()
    out = console or Console()
    with ExitStack() as stack:
        stack.enter_context(_hangup_and_term_as_ctrl_c())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairgate-demo-")))
        try:
            target = stack.enter_context(_redis(redis_url))
        except DemoRefused as refused:
            out.print(f"[red]fairgate demo:[/red] {refused}")
            return 2
        out.print(f"[bold]fairgate demo[/bold]: Redis at {target}"
                  + (" (password required)" if target.apart()[1] else "")
                  + f", work dir {workdir}")
        out.print("while the demo runs, point the other commands (status, why, audit, "
                  "report) at its Redis:")
        out.print(f"  {redis_env(target)} fairgate status", markup=False, highlight=False,
                  soft_wrap=True)
        write_bundle(workdir / "certs", extra_sans=("127.0.0.1", "localhost"))
        config = write_demo_config(workdir / "config")
        out.print("certificates and a three-tenant config written; starting fairgate serve...")
        clock_file = workdir / "clock"
        clock_file.write_text(repr(time.time()), encoding="ascii")
        server = stack.enter_context(
            ServeProcess(workdir / "certs", target, workdir / "config", workdir / "serve.log",
                         wait_for_rebuild=True, clock_file=clock_file)
        )
        out.print(f"fairgate serve is up at {server.base_url} (TLS verified against ca.crt)")
        client = connect_redis(target, timeout=None)
        stack.callback(client.close)
        http = stack.enter_context(server.client())
        # The virtual run ends by the moment it starts in real time, so no audit record
        # lies in the future (`fairgate report` and the console bill up to now).
        # The webhook runs on the same virtual clock (``clock_file``): one time in the audit.
        demo = DemoCluster(WebhookClient(http, config, clock_file), config, client,
                           time.time() - HORIZON)
        stream = demo_stream(pods)
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          console=out) as progress:
                task = progress.add_task(_created_label(pods, len(stream)), total=len(stream))
                start = demo.clock()
                for i, pod in enumerate(stream):
                    demo.advance_to(start + i * ARRIVAL_GAP)
                    demo.create(pod)
                    demo.settle()
                    progress.advance(task)
                drain = progress.add_task("dispatcher draining the queues", total=None)
                demo.finish(start + HORIZON)
                demo.advance_to(time.time())  # the pods end, up to now: what the bill sees
                progress.update(drain, total=1, completed=1)
        except (DemoError, httpx.HTTPError) as exc:
            out.print(f"[red]demo failed:[/red] {exc}\n--- fairgate serve log ---\n"
                      + server.log_tail())
            return 1
        for table in tenant_tables(demo.tallies):
            out.print(table)
        out.print(_reasons(demo.tallies))
        out.print(_counts(demo, pods))
        result, entries = AuditLog(client, out=io.StringIO()).verify()
        out.print(
            f"{demo.webhook.sent} AdmissionReviews over HTTPS ({demo.created} creations + "
            f"{demo.recreated} re-created after preemption); "
            f"{demo.cluster.preemptions} preemptions; still waiting: {demo.waiting()}")
        out.print(f"audit chain: {result.checked} records, "
                  + ("verified" if result.ok else f"BROKEN: {result.problem}"))
        if not result.ok:
            return 1
        since, until = window(None, None)  # `fairgate report`'s and the console's window
        billed = bill((e.record for e in entries if e.record is not None), since, until)
        for table in bill_tables(billed, f"cost from the verified audit log, {billed.currency}, "
                                         "this month so far (what `fairgate report` prints)"):
            out.print(table)
        out.print(idle_line(billed))
        out.print(f"{HORIZON / 3600:g} virtual hours replayed in "
                  f"{time.monotonic() - began:.1f} s")
        if web_console:
            return _web_console(target, workdir / "config", out, console_port)
    return 0


def _web_console(target: RedisTarget, config_dir: Path, out: Console, port: int) -> int:
    """Serve the console on the demo's Redis until Ctrl-C (the caller's stack stays up)."""
    from webhook.console.run import ConsoleError, ConsoleOptions, run_console

    out.print("the demo stack stays up for [bold]fairgate console[/bold]; open the URL "
              "below, Ctrl-C stops everything")
    options = ConsoleOptions(redis=target, config_dir=config_dir, port=port, auth="token",
                             sample_interval=10.0)
    try:
        return run_console(options, out=out.file)
    except ConsoleError:
        out.print(f"port {port} is taken: using a free port")
        return run_console(replace(options, port=0), out=out.file)

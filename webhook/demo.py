"""``fairgate demo``: the webhook at work on this machine, no cluster needed.

Contract: :func:`run_demo` starts a ``redis-server`` (unless a URL is given), writes a
CA and serving certificate and an embedded three-tenant config into a temporary
directory, runs ``fairgate serve`` as a child process over HTTPS on loopback, sends it
a deterministic, realistic stream of AdmissionReview v1 requests (verifying the server
against the generated CA), shows progress and then a per-tenant table. Everything it
started or wrote is removed at the end. Exit code 0 when every request got a valid
answer, 1 otherwise (the server's log is shown).
"""

from __future__ import annotations

import base64
import json
import random
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from certs import write_bundle
from fairshare.localredis import local_redis
from tenants import resources
from tenants.localdir import load_config_dir
from tenants.models import QUEUE_GATE, FairgateConfig
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
    ceiling: {gpuEquivalents: 5}
    admins: {groups: [team-b-admins]}
  team-c:
    weight: 1
    ceiling: {gpuEquivalents: 4}
    admins: {users: [carol@example.com]}
    classes: [inference]
onRedisUnavailable: deny
"""

QUOTAS = {
    "team-a": """\
nominal: {gpu: 4, mig-1g.5gb: 7}
borrowLimit: {gpuEquivalents: 2}
inferenceReserve: {gpuEquivalents: 1}
defaultClass: training
""",
    "team-b": """\
nominal: {gpu: 3}
borrowLimit: {gpuEquivalents: 1}
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


def write_demo_config(directory: Path) -> FairgateConfig:
    """Write the demo's config files into ``directory`` and return the loaded config."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "platform.yaml").write_text(PLATFORM_YAML)
    for tenant, text in QUOTAS.items():
        (directory / f"quota-{tenant}.yaml").write_text(text)
    (directory / "namespaces.yaml").write_text(NAMESPACES_YAML)
    return load_config_dir(directory)


@dataclass(frozen=True)
class DemoPod:
    """One pod of the demo stream."""

    namespace: str
    name: str
    demand: Mapping[str, int]
    pod_class: str | None = None
    owner_kind: str | None = None
    group: tuple[str, int] | None = None

    def manifest(self) -> dict[str, Any]:
        """The pod as the API server would send it."""
        limits = {resources.k8s_name(r): str(n) for r, n in self.demand.items()}
        labels: dict[str, str] = {"app": self.name.rsplit("-", 1)[0]}
        annotations: dict[str, str] = {}
        if self.pod_class:
            labels["fairgate.io/class"] = self.pod_class
        if self.group:
            labels["fairgate.io/pod-group"] = self.group[0]
            annotations["fairgate.io/pod-group-size"] = str(self.group[1])
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
    """A deterministic mixed stream of about ``total`` pods (gangs kept whole)."""
    rng = random.Random(seed)
    kinds: list[tuple[int, Any]] = [
        # (weight, factory(i) -> list of pods)
        (5, lambda i: [DemoPod("team-a-prod", f"chat-{i}", {"mig-1g.5gb": 1},
                               owner_kind="ReplicaSet")]),
        (6, lambda i: [DemoPod("team-a-research", f"pretrain-{i}", {"gpu": 1},
                               owner_kind="Job")]),
        (1, lambda i: [DemoPod("team-a-research", f"ddp{i}-{m}", {"gpu": 1}, "training",
                               "Job", (f"ddp{i}", 4)) for m in range(4)]),
        (4, lambda i: [DemoPod("team-b-ml", f"finetune-{i}", {"gpu": 2}, owner_kind="Job")]),
        (3, lambda i: [DemoPod("team-b-ml", f"embed-{i}", {"gpu": 1}, "inference",
                               "ReplicaSet")]),
        (1, lambda i: [DemoPod("team-b-ml", f"huge-{i}", {"gpu": 6}, "inference")]),
        (4, lambda i: [DemoPod("team-c-serving", f"asr-{i}", {"mig-1g.5gb": 1},
                               owner_kind="ReplicaSet")]),
        (2, lambda i: [DemoPod("team-c-serving", f"rerank-{i}", {"mig-3g.20gb": 1},
                               "inference", "ReplicaSet")]),
        (1, lambda i: [DemoPod("team-c-serving", f"train-{i}", {"gpu": 1}, "training",
                               "Job")]),
        (2, lambda i: [DemoPod("sandbox", f"notebook-{i}", {"gpu": 1})]),
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


@dataclass
class TenantTally:
    """What happened to one tenant's pods."""

    nominal_slices: int = 0
    weight: float = 0.0
    admitted: int = 0
    used_slices: int = 0
    queued: int = 0
    denied: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class DemoError(RuntimeError):
    """The webhook answered something that is not a valid admission response."""


def _is_gated(response: Mapping[str, Any]) -> bool:
    patch = response.get("patch")
    if not patch:
        return False
    ops = json.loads(base64.b64decode(patch))
    return any(QUEUE_GATE in json.dumps(op.get("value")) for op in ops
               if op.get("path", "").startswith("/spec/schedulingGates"))


def _tally(
    tallies: dict[str, TenantTally], config: FairgateConfig, pod: DemoPod,
    answer: Mapping[str, Any], uid: str,
) -> None:
    response = answer.get("response")
    if answer.get("kind") != "AdmissionReview" or not isinstance(response, dict) \
            or response.get("uid") != uid:
        raise DemoError(f"invalid answer for {pod.namespace}/{pod.name}: {answer}")
    if not pod.demand:
        return
    tenant = config.tenant_of_namespace(pod.namespace) or NO_TENANT
    tally = tallies.setdefault(tenant, TenantTally())
    if not response["allowed"]:
        tally.denied += 1
        reason = response.get("auditAnnotations", {}).get("reason", "?")
        tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
    elif _is_gated(response):
        tally.queued += 1
    else:
        tally.admitted += 1
        tally.used_slices += resources.total_slices(pod.demand)


def _table(tallies: Mapping[str, TenantTally]) -> Table:
    table = Table(title="fairgate demo: per-tenant outcome (GPU-eq = 7 compute slices)")
    for column in ("tenant", "weight", "nominal GPU-eq", "admitted", "used GPU-eq", "queued",
                   "denied", "denial reasons"):
        table.add_column(column, justify="left" if column in ("tenant", "denial reasons")
                         else "right")
    for name in sorted(tallies):
        t = tallies[name]
        table.add_row(
            name,
            f"{t.weight:g}" if t.weight else "-",
            resources.gpu_equivalents(t.nominal_slices) if t.weight else "-",
            str(t.admitted),
            resources.gpu_equivalents(t.used_slices),
            str(t.queued),
            str(t.denied),
            ", ".join(f"{r} x{n}" for r, n in sorted(t.reasons.items())),
        )
    return table


@contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url:
        yield url
    else:
        with local_redis() as started:
            yield started


def run_demo(redis_url: str | None = None, pods: int = 120, console: Console | None = None) -> int:
    """Run the demo (see the module contract); returns the exit code."""
    out = console or Console()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairgate-demo-")))
        url = stack.enter_context(_redis(redis_url))
        out.print(f"[bold]fairgate demo[/bold]: Redis at {url}, work dir {workdir}")
        write_bundle(workdir / "certs", extra_sans=("127.0.0.1", "localhost"))
        config = write_demo_config(workdir / "config")
        out.print("certificates and a three-tenant config written; starting fairgate serve...")
        server = stack.enter_context(
            ServeProcess(workdir / "certs", url, workdir / "config", workdir / "serve.log")
        )
        out.print(f"fairgate serve is up at {server.base_url} (TLS verified against ca.crt)")
        tallies = {t.name: TenantTally(t.nominal_slices, t.weight) for t in config.tenants()}
        stream = demo_stream(pods)
        try:
            with server.client() as client, Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                console=out, transient=False,
            ) as progress:
                task = progress.add_task("admission reviews", total=len(stream))
                for pod in stream:
                    uid = str(uuid.uuid4())
                    reply = client.post("/mutate", json=admission_review(pod.manifest(), uid))
                    if reply.status_code != 200:
                        raise DemoError(
                            f"/mutate answered HTTP {reply.status_code} for "
                            f"{pod.namespace}/{pod.name}: {reply.text[:300]}"
                        )
                    _tally(tallies, config, pod, reply.json(), uid)
                    progress.advance(task)
        except (DemoError, httpx.HTTPError) as exc:
            out.print(f"[red]demo failed:[/red] {exc}\n--- fairgate serve log ---\n"
                      + server.log_tail())
            return 1
        out.print(_table(tallies))
        out.print(
            "Pods in 'queued' carry the scheduling gate fairgate.io/queue; in a cluster "
            "`fairgate dispatch` lifts it when their turn comes."
        )
    return 0

"""The objects that give gangs their size, kept current by watches: what
:func:`admission.gangs.pod_gang` reads a pod's gang size from, never by an API call
while a pod waits for its admission.

Contract:
- :class:`GangWatch` lists and watches, each in a daemon thread, the Jobs
  (``batch/v1``), JobSets (``jobset.x-k8s.io/v1alpha2``) and the PodGroups of the
  Kubernetes Workload API (``scheduling.k8s.io/v1alpha2``), of the coscheduling plugin
  (``scheduling.x-k8s.io/v1alpha1``) and of Volcano (``scheduling.volcano.sh/v1beta1``),
  in all namespaces. A kind the API server does not serve (its CRD not installed, the
  Workload API not enabled) is simply absent, and looked for again later.
- Only the fields gangs are sized from are kept (:func:`trimmed`): a change to anything
  else (a Job's status) changes nothing.
- :meth:`GangWatch.objects` is the :class:`~admission.gangs.GangObjects` seen now (never
  blocks); :meth:`GangWatch.sizes` is gang id (``namespace/key``, as the queue names
  gangs) -> size of every gang those objects declare
  (:func:`admission.gangs.declared_sizes`).
- RBAC it needs: get/list/watch ``jobs`` (batch), ``jobsets`` (jobset.x-k8s.io),
  ``podgroups`` (scheduling.k8s.io, scheduling.x-k8s.io, scheduling.volcano.sh).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from admission.gangs import (
    COSCHEDULING_GROUP,
    JOBSET_GROUP,
    K8S_SCHEDULING,
    VOLCANO_GROUP,
    AsksForGpu,
    GangObjects,
    declared_sizes,
)
from fairshare.cluster.watching import Backoff, watch
from fairshare.queue.model import gang_id

Json = dict[str, Any]

POD_GROUP_VERSIONS = {
    K8S_SCHEDULING: "v1alpha2",
    COSCHEDULING_GROUP: "v1alpha1",
    VOLCANO_GROUP: "v1beta1",
}
"""The API version of each PodGroup kind fairgate reads."""
JOBSET_VERSION = "v1alpha2"


def trimmed(kind: str, obj: Mapping[str, Any]) -> Json:
    """The fields of a watched object that gangs are sized from: its name, namespace and
    uid, and ``spec`` (a Job's ``parallelism``, ``completions``, ``completionMode`` and
    ``activeDeadlineSeconds`` only: the last bounds its pods' run times), plus a JobSet's
    ``status.restarts``."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    kept: Json = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}}
    if kind == "jobs":
        kept["spec"] = {k: spec[k] for k in ("parallelism", "completions", "completionMode",
                                             "activeDeadlineSeconds") if k in spec}
    else:
        kept["spec"] = spec
    if kind == "jobsets":
        kept["status"] = {"restarts": (obj.get("status") or {}).get("restarts") or 0}
    return kept


def _key(kind: str, obj: Mapping[str, Any]) -> Any:
    meta = obj.get("metadata") or {}
    if kind == "jobs":
        return str(meta.get("uid", ""))
    names = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    return names if kind == "jobsets" else (kind, *names)


class GangWatch:
    """Size objects of one API server, as watched (see the module doc). Thread-safe."""

    def __init__(self, api: client.ApiClient, *, backoff: Backoff | None = None,
                 asks_for_gpu: AsksForGpu | None = None) -> None:
        """``asks_for_gpu``: whether a JobSet's pod template asks for GPUs (its replicated
        job's pods count in its gang only then; None: every pod counts)."""
        self._api = api
        self._asks = asks_for_gpu
        self._backoff = backoff or Backoff(maximum=30.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listed: set[str] = set()
        self._stores: dict[str, dict[Any, Json]] = {}
        self._snapshot = GangObjects()
        self._sizes: dict[str, int] | None = None

    def _watches(self) -> list[tuple[str, Callable[..., Any]]]:
        custom = client.CustomObjectsApi(self._api)
        watches: list[tuple[str, Callable[..., Any]]] = [
            ("jobs", client.BatchV1Api(self._api).list_job_for_all_namespaces),
            ("jobsets", functools.partial(custom.list_cluster_custom_object, JOBSET_GROUP,
                                          JOBSET_VERSION, "jobsets")),
        ]
        for group, version in POD_GROUP_VERSIONS.items():
            watches.append((group, functools.partial(custom.list_cluster_custom_object,
                                                     group, version, "podgroups")))
        return watches

    @property
    def ready(self) -> bool:
        """Whether every watch has listed once (an unserved kind counts as listed)."""
        with self._lock:
            return len(self._listed) == 2 + len(POD_GROUP_VERSIONS)

    def start(self) -> None:
        """Start the watch threads (idempotent; returns at once)."""
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            self._threads = [
                threading.Thread(target=self._watch, args=(kind, lister),
                                 name=f"watch-gangs-{kind}", daemon=True)
                for kind, lister in self._watches()
            ]
            threads = list(self._threads)
        for thread in threads:
            thread.start()

    def stop(self) -> None:
        """Ask the threads to stop; they end at their next event or timeout."""
        self._stop.set()
        with self._lock:
            self._threads = []

    def objects(self) -> GangObjects:
        """The size objects seen now."""
        with self._lock:
            return self._snapshot

    def sizes(self) -> dict[str, int]:
        """Gang id -> size of every gang the objects seen now declare (computed once per
        change)."""
        with self._lock:
            snapshot, sizes = self._snapshot, self._sizes
        if sizes is None:
            sizes = {gang_id(ns, key, 2) or "": size
                     for (ns, key), size in declared_sizes(snapshot, self._asks).items()}
            with self._lock:
                if self._snapshot is snapshot:
                    self._sizes = sizes
        return sizes

    # -- what the watch threads call (also fed directly by tests) ---------------------

    def on_list(self, kind: str, items: list[Any]) -> None:
        """Replace what is known of ``kind`` with ``items``."""
        with self._lock:
            self._stores[kind] = {_key(kind, item): trimmed(kind, item) for item in items}
            self._listed.add(kind)
            self._rebuild()

    def on_event(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (``ADDED``, ``MODIFIED``, ``DELETED``) to ``kind``."""
        key = _key(kind, obj)
        with self._lock:
            store = self._stores.setdefault(kind, {})
            if event == "DELETED":
                if store.pop(key, None) is None:
                    return
            else:
                kept = trimmed(kind, obj)
                if store.get(key) == kept:
                    return  # e.g. a Job's status: nothing gangs are sized from
                store[key] = kept
            self._rebuild()

    def _watch(self, kind: str, lister: Callable[..., Any]) -> None:
        watch(lister, functools.partial(self.on_list, kind),
              functools.partial(self.on_event, kind), self._stop, self._backoff,
              absent_ok=True)

    def _rebuild(self) -> None:
        """Swap in a new snapshot (caller holds the lock)."""
        stores = self._stores
        self._snapshot = GangObjects(
            jobs=dict(stores.get("jobs", {})),
            jobsets=dict(stores.get("jobsets", {})),
            pod_groups={key: obj for group in POD_GROUP_VERSIONS
                        for key, obj in stores.get(group, {}).items()},
        )
        self._sizes = None

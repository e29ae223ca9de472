"""The cluster's DRA objects (``resource.k8s.io/v1``), kept current by watches: what a
pod's GPU demand through DRA is computed from, and the GPUs ResourceSlices publish.

Contract:
- :class:`DraWatch` lists and watches, each in a daemon thread, the DeviceClasses,
  ResourceClaimTemplates and ResourceClaims of all namespaces, and with
  ``slices=True`` the ResourceSlices. An API server that does not serve
  ``resource.k8s.io`` (before Kubernetes 1.34) is a cluster with none of them.
- :meth:`DraWatch.objects` is the :class:`~admission.dra.DraObjects` seen now (never
  blocks); :meth:`DraWatch.objects_for` adds what a pod names that the watches have not
  delivered yet (a template created just before its pod), read from the API server; a
  read that fails leaves it out, and the demand then refuses the pod saying so.
- :meth:`DraWatch.node_gpus` is, per node, the GPUs its slices publish
  (:func:`published_gpus`); :attr:`DraWatch.on_change` is called after every change
  to them.
- RBAC it needs: get/list/watch ``deviceclasses``, ``resourceclaimtemplates`` and
  ``resourceclaims`` (and list/watch ``resourceslices``) in ``resource.k8s.io``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from admission.dra import DraObjects, referenced_objects
from fairshare.cluster.watching import Backoff, watch
from tenants import resources

log = logging.getLogger("fairgate.dra")

NVIDIA_DRIVER = "gpu.nvidia.com"
"""The NVIDIA DRA driver for GPUs: the driver whose slices publish fairgate's GPUs."""
READ_TIMEOUT = 2.0
"""Seconds a live read of a template or claim may take (the webhook waits on it)."""

Json = dict[str, Any]
NodeGpus = Mapping[str, Mapping[str, int]]


def published_gpus(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node, the devices the NVIDIA driver's ResourceSlices publish, by short
    resource name: a device of ``type`` ``gpu`` is one ``gpu``, of ``type`` ``mig`` one
    ``mig-<profile>`` (a profile fairgate does not know is left out). Only a pool's newest
    generation counts; slices not bound to one node (``allNodes``, ``nodeSelector``) and
    other drivers' slices are not GPUs fairgate places."""
    newest: dict[tuple[str, str], int] = {}
    usable: list[tuple[tuple[str, str], int, Mapping[str, Any]]] = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        if spec.get("driver") != NVIDIA_DRIVER or not spec.get("nodeName"):
            continue
        key = (str(spec["nodeName"]), str(pool.get("name", "")))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(newest.get(key, generation), generation)
        usable.append((key, generation, spec))
    per_node: dict[str, dict[str, int]] = {}
    for key, generation, spec in usable:
        if generation != newest[key]:
            continue
        counts = per_node.setdefault(key[0], {})
        for device in spec.get("devices") or []:
            short = _device_resource(device.get("attributes") or {})
            if short is not None:
                counts[short] = counts.get(short, 0) + 1
    return {node: counts for node, counts in per_node.items() if counts}


def _device_resource(attributes: Mapping[str, Any]) -> str | None:
    def text(name: str) -> str | None:
        value = attributes.get(name) or attributes.get(f"{NVIDIA_DRIVER}/{name}") or {}
        found = value.get("string") if isinstance(value, Mapping) else None
        return found if isinstance(found, str) else None

    kind = text("type")
    if kind == "gpu":
        return "gpu"
    profile = text("profile")
    if kind == "mig" and profile and resources.is_known(f"mig-{profile}"):
        return f"mig-{profile}"
    return None


class DraWatch:
    """DRA objects of one API server, as watched (see the module doc). Thread-safe."""

    def __init__(self, api: client.ApiClient, *, slices: bool = False,
                 backoff: Backoff | None = None) -> None:
        self._resource = client.ResourceV1Api(api)
        self._with_slices = slices
        self.on_change: Callable[[], None] = lambda: None
        """Called (from a watch thread) after the slices' GPUs may have changed."""
        self._backoff = backoff or Backoff(maximum=30.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listed: set[str] = set()
        self._classes: dict[Any, Json] = {}  # name -> DeviceClass
        self._templates: dict[Any, Json] = {}  # (namespace, name) -> ResourceClaimTemplate
        self._claims: dict[Any, Json] = {}  # (namespace, name) -> ResourceClaim
        self._slices: dict[Any, Json] = {}  # name -> ResourceSlice
        self._snapshot = DraObjects()
        self._node_gpus: dict[str, dict[str, int]] = {}

    @property
    def ready(self) -> bool:
        """Whether every watch has listed once."""
        with self._lock:
            return self._listed >= self._kinds()

    def _kinds(self) -> set[str]:
        return {"classes", "templates", "claims"} | ({"slices"} if self._with_slices else set())

    def start(self) -> None:
        """Start the watch threads (idempotent; returns at once)."""
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            api = self._resource
            watches: list[tuple[str, Callable[..., Any], dict[Any, Json]]] = [
                ("classes", api.list_device_class, self._classes),
                ("templates", api.list_resource_claim_template_for_all_namespaces,
                 self._templates),
                ("claims", api.list_resource_claim_for_all_namespaces, self._claims),
            ]
            if self._with_slices:
                watches.append(("slices", api.list_resource_slice, self._slices))
            self._threads = [
                threading.Thread(target=self._watch, args=watched, name=f"watch-dra-{watched[0]}",
                                 daemon=True)
                for watched in watches
            ]
            threads = list(self._threads)
        for thread in threads:
            thread.start()

    def stop(self) -> None:
        """Ask the threads to stop; they end at their next event or timeout."""
        self._stop.set()
        with self._lock:
            self._threads = []

    def objects(self) -> DraObjects:
        """The DRA objects seen now."""
        with self._lock:
            return self._snapshot

    def node_gpus(self) -> dict[str, dict[str, int]]:
        """Per node, the GPUs its ResourceSlices publish (empty without ``slices``)."""
        with self._lock:
            return self._node_gpus

    def objects_for(self, pod: object, namespace: str) -> DraObjects:
        """:meth:`objects`, completed with the templates and claims ``pod`` names that
        are not in it yet, read from the API server now."""
        objects = self.objects()
        templates, claims = referenced_objects(pod)
        missing_templates = [n for n in templates if (namespace, n) not in objects.templates]
        missing_claims = [n for n in claims if (namespace, n) not in objects.claims]
        if not missing_templates and not missing_claims:
            return objects
        found_templates = dict(objects.templates)
        for name in missing_templates:
            read = self._read(self._resource.read_namespaced_resource_claim_template,
                              name, namespace)
            if read is not None:
                found_templates[(namespace, name)] = _template_spec(read)
        found_claims = dict(objects.claims)
        for name in missing_claims:
            read = self._read(self._resource.read_namespaced_resource_claim, name, namespace)
            if read is not None:
                found_claims[(namespace, name)] = read.get("spec") or {}
        return replace(objects, templates=found_templates, claims=found_claims)

    def _read(self, reader: Callable[..., Any], name: str, namespace: str) -> Json | None:
        try:
            response = reader(name, namespace, _preload_content=False,
                              _request_timeout=READ_TIMEOUT)
            found: Json = json.loads(response.data)
            return found
        except (ApiException, HTTPError, OSError, ValueError) as error:
            if not (isinstance(error, ApiException) and error.status == 404):
                log.warning("could not read %s/%s: %s", namespace, name, error)
            return None

    def _watch(self, kind: str, lister: Callable[..., Any], store: dict[Any, Json]) -> None:
        def on_list(items: list[Any]) -> None:
            with self._lock:
                store.clear()
                for item in items:
                    store[_key(kind, item)] = item
                self._listed.add(kind)
                self._rebuild(kind)
            self._changed(kind)

        def on_event(event: str, obj: dict[str, Any]) -> None:
            with self._lock:
                if event == "DELETED":
                    store.pop(_key(kind, obj), None)
                else:
                    store[_key(kind, obj)] = obj
                self._rebuild(kind)
            self._changed(kind)

        watch(lister, on_list, on_event, self._stop, self._backoff, absent_ok=True)

    def _rebuild(self, kind: str) -> None:
        """Swap in a new snapshot after a change to ``kind`` (caller holds the lock)."""
        if kind == "slices":
            self._node_gpus = published_gpus(self._slices.values())
            return
        self._snapshot = DraObjects(
            extended_names={
                str(spec["extendedResourceName"]): name
                for name, obj in self._classes.items()
                if (spec := obj.get("spec") or {}).get("extendedResourceName")
            },
            templates={key: _template_spec(obj) for key, obj in self._templates.items()},
            claims={key: obj.get("spec") or {} for key, obj in self._claims.items()},
        )

    def _changed(self, kind: str) -> None:
        if kind == "slices":
            self.on_change()


def _key(kind: str, obj: Mapping[str, Any]) -> Any:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    if kind in ("templates", "claims"):
        return (str(meta.get("namespace", "")), name)
    return name


def _template_spec(template: Mapping[str, Any]) -> Json:
    spec: Json = (template.get("spec") or {}).get("spec") or {}
    return spec

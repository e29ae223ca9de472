"""The cluster's DRA objects (``resource.k8s.io/v1``), kept current by watches: what a
pod's GPU demand through DRA is computed from, and the GPUs ResourceSlices publish.

Contract:
- :class:`DraWatch` lists and watches, each in a daemon thread, the DeviceClasses,
  ResourceClaimTemplates and ResourceClaims of all namespaces and the ResourceSlices.
  An API server that does not serve ``resource.k8s.io`` (before Kubernetes 1.34) is a
  cluster with none of them.
- :meth:`DraWatch.objects` is the :class:`~admission.dra.DraObjects` seen now (never
  blocks); :meth:`DraWatch.objects_for` adds what a pod names that the watches have not
  delivered yet (a template created just before its pod), read from the API server; a
  read that fails leaves it out, and the demand then refuses the pod saying so.
- :meth:`DraWatch.node_gpus` is, per node, the GPUs its slices publish
  (:func:`published_gpus`); :attr:`DraWatch.on_change` is called after every change
  to them, :attr:`DraWatch.on_claim` after every change to a ResourceClaim (with its
  namespace and name).
- RBAC it needs: get/list/watch ``deviceclasses``, ``resourceclaimtemplates`` and
  ``resourceclaims``, and list/watch ``resourceslices``, in ``resource.k8s.io``.
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

from admission.devices import NVIDIA_DRIVER, published_devices
from admission.dra import AllocatedDevice, DraObject, DraObjects, referenced_objects
from admission.pods import PodView
from fairshare.cluster.watching import Backoff, watch

log = logging.getLogger("fairgate.dra")

READ_TIMEOUT = 2.0
"""Seconds a live read of a template or claim may take (the webhook waits on it)."""

Json = dict[str, Any]
NodeGpus = Mapping[str, Mapping[str, int]]


def published_gpus(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node, the devices the NVIDIA driver's ResourceSlices publish, by short
    resource name (:func:`admission.devices.published_devices`: a device of ``type``
    ``gpu`` is one ``gpu``, of ``type`` ``mig`` one ``mig-<profile>``; a profile fairgate
    does not know is left out). Only a pool's newest generation counts; slices not bound
    to one node (``allNodes``, ``nodeSelector``) and other drivers' devices are not GPUs
    fairgate places."""
    per_node: dict[str, dict[str, int]] = {}
    for device in published_devices(slices):
        if device.driver == NVIDIA_DRIVER and device.node and device.resource:
            counts = per_node.setdefault(device.node, {})
            counts[device.resource] = counts.get(device.resource, 0) + 1
    return per_node


class DraWatch:
    """DRA objects of one API server, as watched (see the module doc). Thread-safe."""

    def __init__(self, api: client.ApiClient, *, backoff: Backoff | None = None) -> None:
        self._resource = client.ResourceV1Api(api)
        self.on_change: Callable[[], None] = lambda: None
        """Called (from a watch thread) after the slices' GPUs may have changed."""
        self.on_claim: Callable[[str, str], None] = lambda namespace, name: None
        """Called (from a watch thread) after a ResourceClaim changed."""
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

    @staticmethod
    def _kinds() -> set[str]:
        return {"classes", "templates", "claims", "slices"}

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
                ("slices", api.list_resource_slice, self._slices),
            ]
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
        """Per node, the GPUs its ResourceSlices publish."""
        with self._lock:
            return self._node_gpus

    def objects_for(self, pod: PodView, namespace: str) -> DraObjects:
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
                found_templates[(namespace, name)] = _template(read)
        found_claims = dict(objects.claims)
        for name in missing_claims:
            read = self._read(self._resource.read_namespaced_resource_claim, name, namespace)
            if read is not None:
                found_claims[(namespace, name)] = _claim(read)
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
            key = _key(kind, obj)
            with self._lock:
                if event == "DELETED":
                    store.pop(key, None)
                else:
                    store[key] = obj
                self._rebuild(kind)
            self._changed(kind)
            if kind == "claims":
                self.on_claim(*key)

        watch(lister, on_list, on_event, self._stop, self._backoff, absent_ok=True)

    def _rebuild(self, kind: str) -> None:
        """Swap in a new snapshot after a change to ``kind`` (caller holds the lock)."""
        snapshot = self._snapshot
        if kind == "slices":
            self._node_gpus = published_gpus(self._slices.values())
            self._snapshot = replace(snapshot, devices=published_devices(self._slices.values()))
        elif kind == "classes":
            self._snapshot = replace(
                snapshot,
                extended_names={
                    str(spec["extendedResourceName"]): name
                    for name, obj in self._classes.items()
                    if (spec := obj.get("spec") or {}).get("extendedResourceName")
                },
                class_selectors={name: _selectors(obj) for name, obj in self._classes.items()},
            )
        elif kind == "templates":
            self._snapshot = replace(snapshot, templates={
                key: _template(obj) for key, obj in self._templates.items()})
        else:
            self._snapshot = replace(snapshot, claims={
                key: _claim(obj) for key, obj in self._claims.items()})

    def _changed(self, kind: str) -> None:
        if kind == "slices":
            self.on_change()


def _key(kind: str, obj: Mapping[str, Any]) -> Any:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    if kind in ("templates", "claims"):
        return (str(meta.get("namespace", "")), name)
    return name


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _template(template: Mapping[str, Any]) -> DraObject:
    return DraObject(spec=(template.get("spec") or {}).get("spec") or {}, uid=_uid(template))


def _claim(claim: Mapping[str, Any]) -> DraObject:
    """A ResourceClaim as :class:`DraObject`: its owner is the controller Pod's uid."""
    owners = (claim.get("metadata") or {}).get("ownerReferences") or []
    owner = next((str(o.get("uid") or "") for o in owners
                  if o.get("kind") == "Pod" and o.get("controller")), "")
    allocation = ((claim.get("status") or {}).get("allocation") or None)
    results = None if allocation is None else tuple(
        AllocatedDevice(str(r.get("request", "")), str(r.get("driver", "")),
                        str(r.get("pool", "")), str(r.get("device", "")),
                        bool(r.get("adminAccess")))
        for r in (allocation.get("devices") or {}).get("results") or [])
    return DraObject(spec=claim.get("spec") or {}, uid=_uid(claim), owner=owner,
                     allocation=results)


def _selectors(device_class: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str((s.get("cel") or {}).get("expression") or "")
                 for s in (device_class.get("spec") or {}).get("selectors") or []
                 if (s.get("cel") or {}).get("expression"))

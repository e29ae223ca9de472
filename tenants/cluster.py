"""The config source for a cluster: watch fairgate's ConfigMaps and tenant Namespaces.

Contract:
- :class:`ClusterConfigSource` lists, then watches, the ConfigMaps of the control
  namespace (``fairgate-platform`` and ``quota-*``; others are ignored) and the Namespaces
  carrying ``fairgate.io/tenant``, each in a daemon thread, with the official
  ``kubernetes`` client. It becomes ready once both first lists are applied (a missing
  ``fairgate-platform`` then means "no tenants" and is reported in ``last_error``).
- Every change is applied per object through :class:`~tenants.source.ConfigAssembler`
  and the new snapshot swapped in atomically. A broken ConfigMap keeps the last good
  version of that object; it is reported in ``last_error``, in
  ``fairgate_config_reload_failures_total{configmap}`` and as a Warning Event
  (reason ``InvalidFairgateConfig``) on the ConfigMap through the core v1 events API.
- A watch that ends (server timeout) resumes from the last resource version seen
  (bookmarks included); an expired one (410 Gone) is replaced by a fresh list; other
  failures retry after an exponential backoff (1 s doubling up to ``max_backoff``); a
  silent dead connection is noticed by a client-side read timeout.
- A list or watch that fails is reported in ``last_error`` under
  ``<namespace>/configmaps`` or ``namespaces`` until a list succeeds again.
- RBAC it needs: list/watch ``configmaps`` and create ``events`` in the control
  namespace; list/watch ``namespaces``.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from tenants.models import (
    CONTROL_NAMESPACE,
    PLATFORM_CONFIGMAP,
    QUOTA_CONFIGMAP_PREFIX,
    TENANT_LABEL,
)
from tenants.source import ConfigAssembler, ConfigSource, report_failure

log = logging.getLogger(__name__)

# The client's config and watch helpers are untyped: use them through Any.
config: Any = _config
Watch: Any = _watch.Watch

EVENT_REASON = "InvalidFairgateConfig"
COMPONENT = "fairgate"
MAX_EVENT_MESSAGE = 1024
GONE = 410
REQUEST_TIMEOUT = 30
"""Seconds to connect and to wait for a list; a watch may stay idle up to its timeout + 30."""


def api_client_from_environment(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client: in-cluster credentials if present, else ``kubeconfig`` / $KUBECONFIG."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    return api


class ClusterConfigSource(ConfigSource):
    """Config from the cluster, hot-reloaded (see the module doc)."""

    def __init__(self, api: client.ApiClient, namespace: str = CONTROL_NAMESPACE,
                 watch_timeout_seconds: int = 300, max_backoff: float = 30.0) -> None:
        super().__init__()
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.watch_timeout_seconds = watch_timeout_seconds
        self.max_backoff = max_backoff
        self._state = ConfigAssembler(namespace)
        self._state_lock = threading.Lock()
        self._listed: set[str] = set()
        self._api_errors: dict[str, str] = {}
        self._known: dict[str, Any] = {}  # our ConfigMaps: name -> metadata
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}
        self._first_load = threading.Event()
        self.instance = socket.gethostname()

    def start(self) -> None:
        """Start the two watch threads (returns at once; see :meth:`wait_ready`)."""
        if self._threads:
            return
        for kind, target in (("configmaps", self._configmap_lists),
                             ("namespaces", self._namespace_lists)):
            thread = threading.Thread(target=self._run, args=(kind, *target()),
                                      name=f"fairgate-watch-{kind}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the first full load (or ``timeout``); return ``ready``."""
        self._first_load.wait(timeout)
        return self.ready

    def close(self) -> None:
        """Stop watching; a thread blocked on an idle watch ends when it times out."""
        self._stop.set()
        for active in list(self._watches.values()):
            active.stop()
        for thread in self._threads:
            thread.join(timeout=1.0)

    # -- the watch loop ------------------------------------------------------------------

    def _configmap_lists(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        return self.core.list_namespaced_config_map, {"namespace": self.namespace}

    def _namespace_lists(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        return self.core.list_namespace, {"label_selector": TENANT_LABEL}

    def _run(self, kind: str, lister: Callable[..., Any], args: dict[str, Any]) -> None:
        version: str | None = None
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if version is None:
                    listing = lister(_request_timeout=REQUEST_TIMEOUT, **args)
                    version = listing.metadata.resource_version
                    self._apply_list(kind, listing.items)
                active = Watch()
                self._watches[kind] = active
                for event in active.stream(lister, resource_version=version,
                                           timeout_seconds=self.watch_timeout_seconds,
                                           allow_watch_bookmarks=True,
                                           _request_timeout=(REQUEST_TIMEOUT,
                                                             self.watch_timeout_seconds + 30),
                                           **args):
                    if self._stop.is_set():
                        break
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply_event(kind, event["type"], event["object"])
                version = active.resource_version or version
                backoff = 1.0
                self._recovered(kind)
            except ApiException as exc:
                if exc.status == GONE:
                    log.info("%s watch expired (410 Gone): listing again", kind)
                    version = None
                    continue
                backoff = self._back_off(kind, exc, backoff)
                version = None
            except (HTTPError, OSError, ValueError) as exc:
                backoff = self._back_off(kind, exc, backoff)
            except Exception as exc:  # a long-lived watch must survive surprises
                log.exception("%s watch crashed; listing again", kind)
                backoff = self._back_off(kind, exc, backoff)
                version = None

    def _back_off(self, kind: str, exc: BaseException, backoff: float) -> float:
        log.warning("%s watch failed (%s); retrying in %.0fs", kind, exc, backoff)
        with self._state_lock:
            self._api_errors[self._watch_name(kind)] = _api_failure(exc)
            self._publish()
        self._stop.wait(backoff)
        return min(backoff * 2, self.max_backoff)

    # -- applying objects ----------------------------------------------------------------

    def _apply_list(self, kind: str, items: Iterable[Any]) -> None:
        failed: dict[str, str] = {}
        with self._state_lock:
            if kind == "namespaces":
                seen = {ns.metadata.name: ns.metadata.labels for ns in items}
                for gone in set(self._state.namespaces) - set(seen):
                    self._state.set_namespace(gone, None)
                for name, labels in seen.items():
                    self._state.set_namespace(name, labels)
            else:
                ours = {cm.metadata.name: cm for cm in items if _is_ours(cm.metadata.name)}
                for gone in set(self._known) - set(ours):
                    failed.update(self._apply_configmap(gone, None))
                if PLATFORM_CONFIGMAP not in ours:
                    failed.update(self._state.set_platform(None))
                for name in sorted(ours, key=lambda n: n != PLATFORM_CONFIGMAP):
                    failed.update(self._apply_configmap(name, ours[name]))
            self._listed.add(kind)
            self._api_errors.pop(self._watch_name(kind), None)
            self._publish()
            reports = self._with_metadata(failed)
        self._report(reports)

    def _apply_event(self, kind: str, kind_of_event: str, obj: Any) -> None:
        deleted = kind_of_event == "DELETED"
        with self._state_lock:
            if kind == "namespaces":
                self._state.set_namespace(obj.metadata.name,
                                          None if deleted else obj.metadata.labels)
                failed: dict[str, str] = {}
            elif _is_ours(obj.metadata.name):
                failed = self._apply_configmap(obj.metadata.name, None if deleted else obj)
            else:
                return
            self._publish()
            reports = self._with_metadata(failed)
        self._report(reports)

    def _apply_configmap(self, name: str, configmap: Any | None) -> dict[str, str]:
        """Apply one of our ConfigMaps (None: deleted); returns the objects that failed."""
        if configmap is None:
            self._known.pop(name, None)
            data, labels = None, None
        else:
            self._known[name] = configmap.metadata
            data, labels = configmap.data or {}, configmap.metadata.labels
        if name == PLATFORM_CONFIGMAP:
            return self._state.set_platform(data)
        return self._state.set_quota(name, data, labels)

    def _with_metadata(self, failed: Mapping[str, str]) -> list[tuple[str, str, bool, Any]]:
        """(object, message, whether a good version of it stays in use, its ConfigMap's
        metadata if it still exists) per failure."""
        prefix = f"{self.namespace}/"
        return [(obj, message, self._state.in_use(obj), self._known.get(obj.removeprefix(prefix)))
                for obj, message in failed.items()]

    def _recovered(self, kind: str) -> None:
        with self._state_lock:
            if self._api_errors.pop(self._watch_name(kind), None) is not None:
                self._publish()

    def _watch_name(self, kind: str) -> str:
        return f"{self.namespace}/configmaps" if kind == "configmaps" else "namespaces"

    def _publish(self) -> None:
        errors = {**self._state.errors, **self._api_errors}
        if self._listed >= {"configmaps", "namespaces"}:
            self._install(self._state.snapshot(), errors)
            self._first_load.set()
        else:
            self._set_errors(errors)

    def _report(self, failed: Iterable[tuple[str, str, bool, Any]]) -> None:
        for obj, message, kept, meta in failed:
            report_failure(obj, message, kept)
            if meta is not None:
                self._post_event(meta, message)

    def _post_event(self, meta: Any, message: str) -> None:
        """A Warning Event on the ConfigMap ``meta`` describes (best effort: only logged)."""
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{meta.name}.{uuid.uuid4().hex[:16]}",
                                         namespace=meta.namespace or self.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="ConfigMap", name=meta.name,
                namespace=meta.namespace or self.namespace, uid=meta.uid,
                resource_version=meta.resource_version,
            ),
            reason=EVENT_REASON,
            message=_truncate(f"not loaded, keeping the last good version: {message}"),
            type="Warning",
            source=client.V1EventSource(component=COMPONENT, host=self.instance),
            reporting_component=COMPONENT,
            reporting_instance=self.instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(meta.namespace or self.namespace, event)
        except (ApiException, HTTPError, OSError) as exc:
            log.warning("could not post an Event on ConfigMap %s: %s", meta.name, exc)


def _api_failure(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"list/watch failed: {exc.status} {exc.reason} (check fairgate's RBAC)"
    return f"list/watch failed: {type(exc).__name__}: {exc}"


def _is_ours(name: str) -> bool:
    return name == PLATFORM_CONFIGMAP or (
        name.startswith(QUOTA_CONFIGMAP_PREFIX) and len(name) > len(QUOTA_CONFIGMAP_PREFIX)
    )


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_EVENT_MESSAGE else text[: MAX_EVENT_MESSAGE - 3] + "..."

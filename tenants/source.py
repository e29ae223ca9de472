"""Where the running webhook and dispatcher get their :class:`FairgateConfig` from.

Contract:
- A :class:`ConfigSource` holds one immutable snapshot, replaced atomically (readers
  take ``source.config`` once per decision and never see a half-applied change).
  ``config`` raises :class:`ConfigNotReadyError` until the first full load; ``ready``
  says whether it has happened; ``generation`` counts swaps.
- ``last_error`` maps each object (file path, or ``<namespace>/<ConfigMap>``) whose
  current version could not be used to what is wrong with it. A broken object never
  replaces the last good one; every failed reload increments
  ``fairgate_config_reload_failures_total{configmap=<object>}``.
- :class:`ConfigAssembler` is the per-object bookkeeping a cluster source needs (last
  good platform and quota per tenant, namespace labels), kept pure for testing.
- :class:`LocalDirSource` reads a ``--config-dir`` (see :mod:`tenants.localdir`), all or
  nothing, and with ``poll_interval`` reloads it when a file changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from prometheus_client import Counter

from tenants.localdir import load_config_dir
from tenants.models import (
    CONTROL_NAMESPACE,
    PLATFORM_CONFIGMAP,
    PLATFORM_KEY,
    QUOTA_CONFIGMAP_PREFIX,
    QUOTA_KEY,
    QUOTA_LABEL,
    TENANT_LABEL,
    FairgateConfig,
    PlatformConfig,
    QuotaSpec,
)
from tenants.schema import ConfigError, Problem, parse_platform, parse_quota

log = logging.getLogger(__name__)

RELOAD_FAILURES = Counter(
    "fairgate_config_reload_failures_total",
    "Config objects (ConfigMaps or files) whose new version could not be used",
    ["configmap"],
)


class ConfigNotReadyError(RuntimeError):
    """The source has not completed its first full load yet."""


class ConfigSource:
    """A current config snapshot with readiness and per-object errors (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: FairgateConfig | None = None
        self._errors: dict[str, str] = {}
        self._generation = 0

    @property
    def config(self) -> FairgateConfig:
        """The current snapshot; raises ConfigNotReadyError before the first full load."""
        current = self._config
        if current is None:
            problems = "; ".join(f"{k}: {v}" for k, v in sorted(self.last_error.items()))
            raise ConfigNotReadyError(
                "fairgate config is not loaded yet" + (f" ({problems})" if problems else "")
            )
        return current

    @property
    def ready(self) -> bool:
        """Whether the first full load has completed."""
        return self._config is not None

    @property
    def generation(self) -> int:
        """How many snapshots have been installed."""
        return self._generation

    @property
    def last_error(self) -> dict[str, str]:
        """Object -> why its current version is not in use (a copy)."""
        with self._lock:
            return dict(self._errors)

    def start(self) -> None:
        """Begin loading (and watching, if the source does)."""

    def close(self) -> None:
        """Stop watching; the last snapshot stays readable."""

    def __enter__(self) -> ConfigSource:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _install(self, config: FairgateConfig, errors: Mapping[str, str]) -> None:
        with self._lock:
            self._config = config
            self._errors = dict(errors)
            self._generation += 1

    def _set_errors(self, errors: Mapping[str, str]) -> None:
        with self._lock:
            self._errors = dict(errors)


def report_failure(obj: str, message: str, kept: bool) -> None:
    """Count and log that ``obj``'s new version could not be used (``kept``: an earlier
    good version of it stays in use)."""
    RELOAD_FAILURES.labels(configmap=obj).inc()
    if kept:
        log.warning("config %s not reloaded, keeping the last good version: %s", obj, message)
    else:
        log.warning("config %s cannot be used, and no earlier version of it was: %s",
                    obj, message)


class ConfigAssembler:
    """Last good platform, quotas and namespace labels, updated one object at a time.

    Each ``set_*`` returns the objects that just failed (name -> message); ``errors``
    holds every object currently not in use. A quota is used only while it is valid
    against the platform in use; otherwise the tenant keeps its last good quota.
    """

    def __init__(self, namespace: str = CONTROL_NAMESPACE) -> None:
        self.namespace = namespace
        self.platform = PlatformConfig()
        self.quotas: dict[str, QuotaSpec] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.errors: dict[str, str] = {}
        self._platform_seen = False
        self._platform_good = False
        self._quota_sources: dict[str, tuple[str | None, Mapping[str, str]]] = {}

    def object_name(self, configmap: str) -> str:
        """How errors name a ConfigMap: ``<namespace>/<name>``."""
        return f"{self.namespace}/{configmap}"

    def snapshot(self) -> FairgateConfig:
        """The config made of every last good object."""
        return FairgateConfig(platform=self.platform, quotas=dict(self.quotas),
                              namespaces={k: dict(v) for k, v in self.namespaces.items()})

    def set_platform(self, data: Mapping[str, str] | None) -> dict[str, str]:
        """Apply ``fairgate-platform``'s data (None: it does not exist)."""
        obj = self.object_name(PLATFORM_CONFIGMAP)
        self._platform_seen = True
        if data is None:
            self.platform = PlatformConfig()
            self._platform_good = False
            self.errors[obj] = "not found: create it (only platform admins may)"
            return self._revalidate_quotas()
        try:
            if PLATFORM_KEY not in data:
                raise ConfigError(obj, [_missing_key(PLATFORM_KEY)])
            text = data[PLATFORM_KEY]
            self.platform = parse_platform(text, f"ConfigMap {obj} key {PLATFORM_KEY}")
        except ConfigError as exc:
            return self._fail(obj, exc)
        self._platform_good = True
        self.errors.pop(obj, None)
        return self._revalidate_quotas()

    def in_use(self, obj: str) -> bool:
        """Whether a good version of ``obj`` (as :meth:`object_name` names it) is in use."""
        name = obj.removeprefix(f"{self.namespace}/")
        if name == PLATFORM_CONFIGMAP:
            return self._platform_good
        return name.removeprefix(QUOTA_CONFIGMAP_PREFIX) in self.quotas

    def platform_missing(self) -> bool:
        """Whether no ``fairgate-platform`` has been applied at all."""
        return not self._platform_seen

    def set_quota(self, name: str, data: Mapping[str, str] | None,
                  labels: Mapping[str, str] | None) -> dict[str, str]:
        """Apply ``quota-<tenant>``'s data and labels (None data: it was deleted)."""
        tenant = name.removeprefix(QUOTA_CONFIGMAP_PREFIX)
        obj = self.object_name(name)
        if data is None:
            self.quotas.pop(tenant, None)
            self._quota_sources.pop(tenant, None)
            self.errors.pop(obj, None)
            return {}
        self._quota_sources[tenant] = (data.get(QUOTA_KEY), dict(labels or {}))
        return self._apply_quota(tenant)

    def _apply_quota(self, tenant: str) -> dict[str, str]:
        obj = self.object_name(QUOTA_CONFIGMAP_PREFIX + tenant)
        text, labels = self._quota_sources[tenant]
        try:
            if labels.get(QUOTA_LABEL) != tenant:
                raise ConfigError(obj, [_label_problem(tenant)])
            if text is None:
                raise ConfigError(obj, [_missing_key(QUOTA_KEY)])
            quota = parse_quota(text, tenant, self.platform, f"ConfigMap {obj} key {QUOTA_KEY}")
        except ConfigError as exc:
            return self._fail(obj, exc)
        self.quotas[tenant] = quota
        self.errors.pop(obj, None)
        return {}

    def _fail(self, obj: str, exc: ConfigError) -> dict[str, str]:
        """Record ``obj`` as broken; report it only if this is news (not a re-read)."""
        if self.errors.get(obj) == str(exc):
            return {}
        self.errors[obj] = str(exc)
        return {obj: str(exc)}

    def _revalidate_quotas(self) -> dict[str, str]:
        failed: dict[str, str] = {}
        for tenant in sorted(self._quota_sources):
            failed.update(self._apply_quota(tenant))
        return failed

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> None:
        """Record a namespace's tenant label (None labels: the namespace is gone)."""
        tenant = (labels or {}).get(TENANT_LABEL)
        if tenant is None:
            self.namespaces.pop(name, None)
        else:
            self.namespaces[name] = {TENANT_LABEL: tenant}


def _missing_key(key: str) -> Problem:
    return Problem("data", f"missing key '{key}': put the YAML document under it")


def _label_problem(tenant: str) -> Problem:
    return Problem(f"metadata.labels.{QUOTA_LABEL}",
                   f"must be {tenant!r}: set label '{QUOTA_LABEL}: {tenant}'")


def start_local_source(directory: Path, poll_interval: float = 1.0) -> LocalDirSource:
    """A :class:`LocalDirSource` on ``directory``, loaded and polled every ``poll_interval`` s.

    Raises :class:`ConfigNotReadyError` naming every problem when the first load fails.
    """
    source = LocalDirSource(directory, poll_interval=poll_interval)
    source.start()
    if not source.ready:
        source.close()
        problems = "; ".join(source.last_error.values())
        raise ConfigNotReadyError(f"cannot load the config in {directory}: {problems}")
    return source


class LocalDirSource(ConfigSource):
    """A ``--config-dir`` loaded all or nothing; polled for changes if ``poll_interval``.

    A directory that fails to load keeps the previous snapshot (none before the first
    success: not ready) and is reported under the failing file's path. A change is loaded
    once the files have stayed the same for one poll interval, so a file caught half
    written is never taken. :meth:`reload` forces a re-read (e.g. on SIGHUP) and returns
    whether it succeeded.
    """

    def __init__(self, directory: Path, poll_interval: float | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self._reload_lock = threading.Lock()

    def start(self) -> None:
        """Load now; with ``poll_interval``, keep watching in a daemon thread."""
        self.reload()
        if self.poll_interval is not None and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="fairgate-config-dir",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def reload(self) -> bool:
        """Re-read the directory; install it if valid, else keep the old snapshot and report."""
        with self._reload_lock:
            self._seen = self._signature()
            try:
                config = load_config_dir(self.directory)
            except ConfigError as exc:  # also unreadable or non-UTF-8 files, by name
                return self._failed(exc.source, str(exc))
            self._install(config, {})
            return True

    def _failed(self, source: str, message: str) -> bool:
        if self.last_error.get(source) != message:
            report_failure(source, message, kept=self.ready)
        self._set_errors({source: message})
        return False

    def _poll(self) -> None:
        assert self.poll_interval is not None
        changing: tuple[tuple[str, int, int], ...] | None = None
        while not self._stop.wait(self.poll_interval):
            current = self._signature()
            if current == self._seen:
                changing = None
            elif current == changing:  # unchanged for a whole interval: the write is done
                self.reload()
            else:  # a file is being written (e.g. truncated, not yet refilled): wait
                changing = current

    def _signature(self) -> tuple[tuple[str, int, int], ...]:
        """Names, sizes and modification times of the directory's YAML files."""
        found: list[tuple[str, int, int]] = []
        for path in sorted(self.directory.glob("*.yaml")):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found.append((path.name, stat.st_size, stat.st_mtime_ns))
        return tuple(found)

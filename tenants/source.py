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
- :class:`LocalDirSource` reads a ``--config-dir`` (see :mod:`tenants.localdir`): the
  first load all or nothing, then file by file, and with ``poll_interval`` reloads it
  when a file changes. A broken file keeps its last good version in use (reported under
  its path) while every other file's valid edit takes effect. The first load is logged
  (``event: config-load``), each accepted reload too (``event: config-reload``, with the
  ``changed`` files and the broken ones ``kept`` at their last good version), and
  each accepted edit of ``platform.yaml`` or a quota file is passed, as a
  :class:`ConfigEdit`, to the ``on_edit`` callback (the webhook audits it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client import Counter

from tenants.configmaps import FieldDiff, field_diff
from tenants.localdir import NAMESPACES_FILE, PLATFORM_FILE, DirScan, scan_config_dir
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
from tenants.schema import (
    ConfigError,
    Problem,
    load_yaml_mapping,
    parse_platform,
    parse_quota,
)

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


@dataclass(frozen=True)
class ConfigEdit:
    """An accepted change of a config file: ``obj`` is the ConfigMap it stands for
    (``fairgate-platform``, ``quota-<tenant>``), ``operation`` CREATE, UPDATE or DELETE,
    ``diff`` the changed fields (as a ConfigMap edit's audit diff)."""

    file: str
    obj: str
    tenant: str
    operation: str
    diff: FieldDiff


def start_local_source(directory: Path, poll_interval: float = 1.0,
                       on_edit: Callable[[ConfigEdit], None] | None = None) -> LocalDirSource:
    """A :class:`LocalDirSource` on ``directory``, loaded and polled every ``poll_interval`` s.

    Raises :class:`ConfigNotReadyError` naming every problem when the first load fails.
    """
    source = LocalDirSource(directory, poll_interval=poll_interval, on_edit=on_edit)
    source.start()
    if not source.ready:
        source.close()
        problems = "; ".join(source.last_error.values())
        raise ConfigNotReadyError(f"cannot load the config in {directory}: {problems}")
    return source


class LocalDirSource(ConfigSource):
    """A ``--config-dir``, reloaded file by file; polled for changes if ``poll_interval``.

    The first load is all or nothing (not ready until every file is valid). After it, each
    file is taken on its own: a broken one keeps its last good version (a quota file
    without one leaves its tenant with no quota; a deleted quota file removes it) and is
    reported under its path, while the others' valid edits are installed. A change is
    loaded once the files have stayed the same for one poll interval, so a file caught
    half written is never taken. :meth:`reload` forces a re-read (e.g. on SIGHUP) and
    returns whether every file was valid.
    """

    def __init__(self, directory: Path, poll_interval: float | None = None,
                 on_edit: Callable[[ConfigEdit], None] | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.poll_interval = poll_interval
        self.on_edit = on_edit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self._reload_lock = threading.Lock()
        self._texts: dict[str, str] = {}  # file name -> the text of the version in use

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
        """Re-read the directory; install every valid file's version, keep the last good
        version of each broken one and report it; whether every file was valid."""
        with self._reload_lock:
            self._seen = self._signature()
            previous = self._config
            try:
                scan = scan_config_dir(self.directory,
                                       previous.platform if previous is not None else None)
            except ConfigError as exc:  # the directory itself is gone: keep everything
                self._report({exc.source: str(exc)})
                return False
            errors = {exc.source: str(exc) for exc in scan.errors}
            if previous is None:
                if not errors:
                    self._texts = dict(scan.texts)
                    self._install(scan.config(), {})
                    log.info("config loaded from %s", self.directory,
                             extra={"fields": {"event": "config-load",
                                               "directory": str(self.directory),
                                               "changed": sorted(scan.texts), "kept": []}})
                    return True
                self._report(errors)
                return False
            self._report(errors)
            self._merge(previous, scan)
            return not errors

    def _report(self, errors: Mapping[str, str]) -> None:
        """Report each object whose error is news, and set the errors."""
        before = self.last_error
        for obj, message in errors.items():
            if before.get(obj) != message:
                kept = self.ready and (obj == str(self.directory) or Path(obj).name in self._texts)
                report_failure(obj, message, kept=kept)
        self._set_errors(errors)

    def _merge(self, previous: FairgateConfig, scan: DirScan) -> None:
        """Install the valid files of ``scan`` over ``previous``'s broken ones' versions."""
        texts = {name: text for name, text in self._texts.items() if name in scan.broken}
        texts.update(scan.texts)
        if texts == self._texts:
            return
        quotas = {tenant: quota for tenant, quota in previous.quotas.items()
                  if tenant in scan.quota_files}
        quotas.update(scan.quotas)
        config = FairgateConfig(
            platform=scan.platform or previous.platform, quotas=quotas,
            namespaces=scan.namespaces if scan.namespaces is not None
            else {k: dict(v) for k, v in previous.namespaces.items()})
        changed = sorted(name for name in texts.keys() | self._texts.keys()
                         if texts.get(name) != self._texts.get(name))
        edits = [self._edit(name, self._texts.get(name), texts.get(name)) for name in changed
                 if name != NAMESPACES_FILE]
        self._texts = texts
        self._install(config, self.last_error)
        log.info("config reloaded from %s: %s changed%s", self.directory, ", ".join(changed),
                 f"; kept the last good {', '.join(sorted(scan.broken))}" if scan.broken
                 else "",
                 extra={"fields": {"event": "config-reload", "directory": str(self.directory),
                                   "changed": changed, "kept": sorted(scan.broken),
                                   "generation": self.generation}})
        if self.on_edit is not None:
            for edit in edits:
                self.on_edit(edit)

    @staticmethod
    def _edit(name: str, before: str | None, after: str | None) -> ConfigEdit:
        """The accepted change of file ``name`` from ``before`` to ``after`` (None: absent)."""
        operation = "CREATE" if before is None else "DELETE" if after is None else "UPDATE"
        if name == PLATFORM_FILE:
            obj, tenant = PLATFORM_CONFIGMAP, ""
        else:
            tenant = name.removesuffix(".yaml").removeprefix(QUOTA_CONFIGMAP_PREFIX)
            obj = QUOTA_CONFIGMAP_PREFIX + tenant
        return ConfigEdit(file=name, obj=obj, tenant=tenant, operation=operation,
                          diff=field_diff(_document(before, name), _document(after, name)))

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


def _document(text: str | None, name: str) -> dict[str, Any]:
    """The YAML mapping of a config file's accepted text ({} for None: no file)."""
    return load_yaml_mapping(text or "", name)

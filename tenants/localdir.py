"""Load a :class:`FairgateConfig` from a local config directory.

Contract: the directory holds ``platform.yaml``, ``quota-<tenant>.yaml`` per tenant and
``namespaces.yaml`` (namespace -> labels), the same YAML as the ConfigMaps.
:func:`scan_config_dir` reads it file by file: each file is checked on its own, and a
:class:`DirScan` holds every valid file's text and model and, for every broken file, a
:class:`~tenants.schema.ConfigError` naming it and its fields. Quotas and namespaces are
checked against the ``platform.yaml`` read with them, or, when that one is broken, the
``fallback`` platform given (the one in use), or, without one, on their own (schema
only). :func:`load_config_dir` is all-or-nothing: it raises the first problem.
Problems: a missing directory (the scan itself raises) or ``platform.yaml``; any other
YAML file (``*.yaml``, ``*.yml``, ``*.json``, e.g. ``quota_team-a.yaml``: a tenant would
silently get no quota), named with the name it was probably meant to have; a namespace
mapped to a tenant ``platform.yaml`` does not define. Any other file (not hidden:
``.name`` and directories are skipped, as a mounted ConfigMap's ``..data``) is logged as a
warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tenants.models import (
    QUOTA_CONFIGMAP_PREFIX,
    TENANT_LABEL,
    FairgateConfig,
    PlatformConfig,
    QuotaSpec,
)
from tenants.schema import ConfigError, Problem, load_yaml_mapping, parse_platform, parse_quota

log = logging.getLogger(__name__)

PLATFORM_FILE = "platform.yaml"
NAMESPACES_FILE = "namespaces.yaml"
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_LAYOUT = (f"a config directory holds {PLATFORM_FILE}, {QUOTA_CONFIGMAP_PREFIX}<tenant>.yaml "
           f"per tenant and {NAMESPACES_FILE}")
_QUOTA_LOOKALIKE = re.compile(r"^quota[^a-z0-9]*(?P<tenant>.+)$", re.IGNORECASE)


@dataclass
class DirScan:
    """One reading of a config directory, file by file (see the module contract).

    ``texts`` maps each valid file's name to its text (``namespaces.yaml`` is there with
    ``""`` when absent: no namespaces); ``errors`` holds one ConfigError per broken file,
    in the order the files are read (platform, then by name, namespaces last), and
    ``broken`` their names.
    """

    platform: PlatformConfig | None = None
    quotas: dict[str, QuotaSpec] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] | None = None
    texts: dict[str, str] = field(default_factory=dict)
    errors: list[ConfigError] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)
    quota_files: dict[str, str] = field(default_factory=dict)
    """Tenant -> the name of its quota file, for every quota file present (valid or not)."""

    def fail(self, name: str, error: ConfigError) -> None:
        """Record that the file ``name`` is broken."""
        self.errors.append(error)
        self.broken.add(name)

    def config(self) -> FairgateConfig:
        """The config made of this scan alone; raises the first problem, if any."""
        if self.errors:
            raise self.errors[0]
        assert self.platform is not None and self.namespaces is not None
        return FairgateConfig(platform=self.platform, quotas=dict(self.quotas),
                              namespaces=self.namespaces)


def scan_config_dir(directory: Path, fallback: PlatformConfig | None = None) -> DirScan:
    """Read and check every config file in ``directory``, each on its own; raises
    ConfigError only when the directory itself is missing."""
    if not directory.is_dir():
        raise ConfigError(str(directory), [Problem(
            "", f"{'not a directory' if directory.exists() else 'directory not found'}: "
            f"give --config-dir the directory holding {PLATFORM_FILE} ({_LAYOUT})")])
    scan = DirScan()
    platform_path = directory / PLATFORM_FILE
    try:
        if not platform_path.is_file():
            raise ConfigError(str(platform_path), [Problem(
                "", f"file not found: create it ({_LAYOUT}; README.md, 'Configuring tenants', "
                "shows each)")])
        text = read_config_file(platform_path)
        scan.platform = parse_platform(text, str(platform_path))
        scan.texts[PLATFORM_FILE] = text
    except ConfigError as exc:
        scan.fail(PLATFORM_FILE, exc)
    platform = scan.platform or fallback
    for path in sorted(directory.iterdir()):
        if path.name in (PLATFORM_FILE, NAMESPACES_FILE) or path.name.startswith("."):
            continue
        try:
            if path.name.startswith(QUOTA_CONFIGMAP_PREFIX) and path.suffix == ".yaml":
                tenant = path.stem.removeprefix(QUOTA_CONFIGMAP_PREFIX)
                scan.quota_files[tenant] = path.name
                text = read_config_file(path)
                scan.quotas[tenant] = parse_quota(text, tenant, platform, str(path))
                scan.texts[path.name] = text
            elif path.suffix.lower() in _CONFIG_SUFFIXES:
                raise ConfigError(str(path), [Problem("", _misnamed(path.name))])
            elif not path.is_dir():
                log.warning("%s: not a config file, ignored (%s)", path, _LAYOUT)
        except ConfigError as exc:
            scan.fail(path.name, exc)
    namespaces_path = directory / NAMESPACES_FILE
    try:
        text = read_config_file(namespaces_path) if namespaces_path.is_file() else ""
        scan.namespaces = _load_namespaces(text, str(namespaces_path), platform)
        scan.texts[NAMESPACES_FILE] = text
    except ConfigError as exc:
        scan.fail(NAMESPACES_FILE, exc)
    return scan


def load_config_dir(directory: Path) -> FairgateConfig:
    """Read and check every config file in ``directory``; raise the first problem."""
    return scan_config_dir(directory).config()


def _misnamed(name: str) -> str:
    """Why a YAML file of a config directory is refused, and its likely intended name."""
    stem = name.rsplit(".", 1)[0]
    if stem.lower() in ("platform", "namespaces"):
        meant = f"{stem.lower()}.yaml"
    elif (quota := _QUOTA_LOOKALIKE.match(stem)) is not None:
        meant = f"{QUOTA_CONFIGMAP_PREFIX}{quota['tenant']}.yaml"
    else:
        return f"not a config file name: {_LAYOUT}; rename or remove it"
    return f"not a config file name: rename it to {meant} ({_LAYOUT})"


def write_config_dir(
    directory: Path, platform_yaml: str, quotas: Mapping[str, str], namespaces_yaml: str
) -> Path:
    """Write a config directory that :func:`load_config_dir` reads: ``platform.yaml``,
    ``quota-<tenant>.yaml`` for each of ``quotas`` (tenant -> YAML), ``namespaces.yaml``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PLATFORM_FILE).write_text(platform_yaml)
    for tenant, text in quotas.items():
        (directory / f"{QUOTA_CONFIGMAP_PREFIX}{tenant}.yaml").write_text(text)
    (directory / NAMESPACES_FILE).write_text(namespaces_yaml)
    return directory


def _load_namespaces(text: str, source: str,
                     platform: PlatformConfig | None) -> dict[str, dict[str, str]]:
    """``namespaces.yaml``'s text checked (tenants against ``platform``, if known)."""
    data = load_yaml_mapping(text, source)
    problems = [
        Problem(str(ns), "must map label names to string values")
        for ns, labels in data.items()
        if not isinstance(labels, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ]
    if problems:
        raise ConfigError(source, problems)
    if platform is not None:
        defined = ", ".join(sorted(platform.tenants)) or "none"
        problems = [
            Problem(f"{ns}.{TENANT_LABEL}", f"tenant {labels[TENANT_LABEL]!r} is not defined "
                    f"in {PLATFORM_FILE} (its tenants: {defined}): fix the name or add the "
                    "tenant")
            for ns, labels in data.items()
            if labels.get(TENANT_LABEL) not in (None, *platform.tenants)
        ]
    if problems:
        raise ConfigError(source, problems)
    return {str(ns): dict(labels) for ns, labels in data.items()}


def read_config_file(path: Path) -> str:
    """The text of a config file (UTF-8); a ConfigError naming it when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path), [Problem("", f"not UTF-8 text (byte {exc.start}): save it as UTF-8")]
        ) from exc
    except OSError as exc:
        raise ConfigError(str(path), [Problem("", f"cannot read: {exc.strerror}")]) from exc

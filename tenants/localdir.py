"""Load a :class:`FairgateConfig` from a local config directory.

Contract: the directory holds ``platform.yaml``, ``quota-<tenant>.yaml`` per tenant and
``namespaces.yaml`` (namespace -> labels), the same YAML as the ConfigMaps. Loading is
all-or-nothing: any problem raises :class:`~tenants.schema.ConfigError` naming the file.
Problems: a missing directory or ``platform.yaml``; any other YAML file (``*.yaml``,
``*.yml``, ``*.json``, e.g. ``quota_team-a.yaml``: a tenant would silently get no
quota), named with the name it was probably meant to have; a namespace mapped to a
tenant ``platform.yaml`` does not define. Any other file (not hidden: ``.name`` and
directories are skipped, as a mounted ConfigMap's ``..data``) is logged as a warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
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


def load_config_dir(directory: Path) -> FairgateConfig:
    """Read and check every config file in ``directory``."""
    if not directory.is_dir():
        raise ConfigError(str(directory), [Problem(
            "", f"{'not a directory' if directory.exists() else 'directory not found'}: "
            f"give --config-dir the directory holding {PLATFORM_FILE} ({_LAYOUT})")])
    platform_path = directory / PLATFORM_FILE
    if not platform_path.is_file():
        raise ConfigError(str(platform_path), [Problem(
            "", f"file not found: create it ({_LAYOUT}; README.md, 'Configuring tenants', "
            "shows each)")])
    platform = parse_platform(read_config_file(platform_path), str(platform_path))
    quotas: dict[str, QuotaSpec] = {}
    for path in sorted(directory.iterdir()):
        if path.name in (PLATFORM_FILE, NAMESPACES_FILE) or path.name.startswith("."):
            continue
        if path.name.startswith(QUOTA_CONFIGMAP_PREFIX) and path.suffix == ".yaml":
            tenant = path.stem.removeprefix(QUOTA_CONFIGMAP_PREFIX)
            quotas[tenant] = parse_quota(read_config_file(path), tenant, platform, str(path))
        elif path.suffix.lower() in _CONFIG_SUFFIXES:
            raise ConfigError(str(path), [Problem("", _misnamed(path.name))])
        elif not path.is_dir():
            log.warning("%s: not a config file, ignored (%s)", path, _LAYOUT)
    namespaces = _load_namespaces(directory / NAMESPACES_FILE, platform)
    return FairgateConfig(platform=platform, quotas=quotas, namespaces=namespaces)


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


def _load_namespaces(path: Path, platform: PlatformConfig) -> dict[str, dict[str, str]]:
    if not path.is_file():
        return {}
    data = load_yaml_mapping(read_config_file(path), str(path))
    problems = [
        Problem(str(ns), "must map label names to string values")
        for ns, labels in data.items()
        if not isinstance(labels, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ]
    if problems:
        raise ConfigError(str(path), problems)
    defined = ", ".join(sorted(platform.tenants)) or "none"
    problems = [
        Problem(f"{ns}.{TENANT_LABEL}", f"tenant {labels[TENANT_LABEL]!r} is not defined in "
                f"{PLATFORM_FILE} (its tenants: {defined}): fix the name or add the tenant")
        for ns, labels in data.items()
        if labels.get(TENANT_LABEL) not in (None, *platform.tenants)
    ]
    if problems:
        raise ConfigError(str(path), problems)
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

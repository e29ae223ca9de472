"""Load a :class:`FairgateConfig` from a local config directory.

Contract: the directory holds ``platform.yaml``, ``quota-<tenant>.yaml`` per tenant and
``namespaces.yaml`` (namespace -> labels), the same YAML as the ConfigMaps. Loading is
all-or-nothing: any problem raises :class:`~tenants.schema.ConfigError` naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tenants.models import QUOTA_CONFIGMAP_PREFIX, FairgateConfig, QuotaSpec
from tenants.schema import ConfigError, Problem, load_yaml_mapping, parse_platform, parse_quota

PLATFORM_FILE = "platform.yaml"
NAMESPACES_FILE = "namespaces.yaml"


def load_config_dir(directory: Path) -> FairgateConfig:
    """Read and check every config file in ``directory``."""
    platform_path = directory / PLATFORM_FILE
    if not platform_path.is_file():
        raise ConfigError(
            str(platform_path),
            [Problem("", "file not found: create it (see docs/configuration.md)")],
        )
    platform = parse_platform(_read(platform_path), str(platform_path))
    quotas: dict[str, QuotaSpec] = {}
    for path in sorted(directory.glob(f"{QUOTA_CONFIGMAP_PREFIX}*.yaml")):
        tenant = path.stem.removeprefix(QUOTA_CONFIGMAP_PREFIX)
        quotas[tenant] = parse_quota(_read(path), tenant, platform, str(path))
    namespaces = _load_namespaces(directory / NAMESPACES_FILE)
    return FairgateConfig(platform=platform, quotas=quotas, namespaces=namespaces)


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


def _load_namespaces(path: Path) -> dict[str, dict[str, str]]:
    if not path.is_file():
        return {}
    data = load_yaml_mapping(_read(path), str(path))
    problems = [
        Problem(str(ns), "must map label names to string values")
        for ns, labels in data.items()
        if not isinstance(labels, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ]
    if problems:
        raise ConfigError(str(path), problems)
    return {str(ns): dict(labels) for ns, labels in data.items()}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path), [Problem("", f"not UTF-8 text (byte {exc.start}): save it as UTF-8")]
        ) from exc
    except OSError as exc:
        raise ConfigError(str(path), [Problem("", f"cannot read: {exc.strerror}")]) from exc

"""Where the webhook gets its config: a local directory or the cluster.

Contract: a :class:`ConfigProvider` is started once, then :meth:`current` returns the
latest good :class:`~tenants.models.FairgateConfig` (None until the first full load) and
:meth:`detail` a short JSON-ready description for ``/readyz``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tenants.localdir import load_config_dir
from tenants.models import FairgateConfig


class ConfigProvider(Protocol):
    """The source of config snapshots the webhook decides with."""

    def start(self) -> None:
        """Load (and keep loading) the config."""

    def stop(self) -> None:
        """Stop watching for changes."""

    def current(self) -> FairgateConfig | None:
        """The latest good config, or None before the first full load."""

    def detail(self) -> dict[str, str]:
        """Where the config comes from and its state (for ``/readyz``)."""


class StaticConfig:
    """A config fixed at start, loaded from a local directory."""

    def __init__(self, directory: Path) -> None:
        """Serve the config of ``directory`` (loaded by :meth:`start`)."""
        self.directory = directory
        self._config: FairgateConfig | None = None

    def start(self) -> None:
        """Load the directory; raises ConfigError naming the file at fault."""
        self._config = load_config_dir(self.directory)

    def stop(self) -> None:
        """Nothing to stop."""

    def current(self) -> FairgateConfig | None:
        """The loaded config."""
        return self._config

    def detail(self) -> dict[str, str]:
        """The directory and whether it is loaded."""
        state = "loaded" if self._config is not None else "not loaded"
        return {"config": state, "config_source": str(self.directory)}


def local_provider(directory: Path) -> ConfigProvider:
    """The provider for ``--config-dir``."""
    return StaticConfig(directory)


def cluster_provider(cert_dir: Path, namespace: str, webhook_configuration: str) -> ConfigProvider:
    """The provider reading ConfigMaps and Namespaces from the cluster."""
    raise NotImplementedError(
        "reading config from the cluster is not available in this build yet: "
        "pass --config-dir DIR"
    )

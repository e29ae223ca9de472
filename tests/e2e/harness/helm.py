"""The `helm` CLI for the chart's tests, built from Go modules like the control plane.

`build_helm()` runs tests/e2e/controlplane/build-helm.sh (cached: a second run takes a
second) and returns the binary. `helm_run` runs it with a private Helm home (no repos,
no plugins, no cache of the user's), so that a run depends on nothing but the chart.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from .controlplane import REPO, run_build

BUILD_SCRIPT = REPO / "tests" / "e2e" / "controlplane" / "build-helm.sh"
CHART = REPO / "charts" / "fairgate"


def build_helm(progress: Callable[[str], None] | None = None) -> Path:
    """Build (or reuse the cached) helm and return its path; `progress` gets each line
    the build script prints."""
    return run_build(BUILD_SCRIPT, progress) / "helm" / "helm"


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """The environment of a helm run: its config, cache and data under `home`."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def helm_run(
    helm: Path, args: Sequence[str], home: Path, kubeconfig: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`helm args...`, its output captured (the caller checks the exit code)."""
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=timeout,
        env=helm_env(home, kubeconfig), check=False,
    )

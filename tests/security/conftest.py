"""Security tests run against the e2e control plane, with tests/e2e's fixtures.

The e2e harness (tests/e2e/harness) is put on the import path and its fixtures are
imported here; see harness.fixtures. Tests that use them must be marked `e2e`, which is
what makes the run build the control plane first.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from harness.fixtures import (
    controlplane,
    fairgate,
    kubelet,
    make_namespace,
    pytest_collection_finish,
    tenant_pods,
)

__all__ = [
    "controlplane",
    "fairgate",
    "kubelet",
    "make_namespace",
    "pytest_collection_finish",
    "tenant_pods",
]

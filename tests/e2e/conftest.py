"""Fixtures for e2e tests against a real control plane built from Go modules.

They live in harness.fixtures, shared with tests/security/: see there.
"""

from harness.fixtures import (
    controlplane,
    fairgate,
    helm,
    kubectl,
    kubelet,
    kueue_home,
    make_namespace,
    pytest_collection_finish,
    tenant_pods,
)

__all__ = [
    "controlplane",
    "fairgate",
    "helm",
    "kubectl",
    "kubelet",
    "kueue_home",
    "make_namespace",
    "pytest_collection_finish",
    "tenant_pods",
]

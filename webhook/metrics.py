"""Prometheus metrics of the admission webhook.

Contract: every :class:`WebhookMetrics` owns its own ``CollectorRegistry`` (so several
apps can live in one process, e.g. in tests); ``/metrics`` shows it together with the
process-wide default registry (process metrics, audit write failures):

- ``fairgate_admission_duration_seconds{webhook, operation}``: histogram of the time
  from a request's arrival to its answer; ``webhook`` is ``mutate`` or ``validate``,
  ``operation`` the AdmissionReview operation (``CREATE``, ``UPDATE``, ...) or
  ``invalid`` for bodies that were refused with a 4xx.
- ``fairgate_admission_decisions_total{verdict}``: decisions by verdict (``admit``,
  ``queue``, ``deny``, ``allow``); with ``tenant_labels="names"`` also by ``tenant``
  (empty when the namespace has none). ``/metrics`` is served on the webhook's port,
  which every source may reach, so tenant names are left out unless the operator says
  that port is closed to all but the API server and Prometheus (``fairgate serve
  --metrics-tenant-labels names``).
- ``fairgate_redis_unavailable_total{policy}``: admissions answered by the
  ``onRedisUnavailable`` policy (``deny`` or ``allow``).
- ``fairgate_admission_overdue_total{webhook}``: requests answered by the deadline
  fallback (no decision within the deadline).
- ``fairgate_admission_errors_total``: unexpected errors turned into a safe answer.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Admission must stay in single milliseconds; the tail buckets show Redis timeouts.
_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST

TENANT_LABELS = ("none", "names")
"""How ``/metrics`` shows tenants: ``none`` (no tenant label, the default) or ``names``."""


class WebhookMetrics:
    """The webhook's collectors, registered in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 tenant_labels: str = "none") -> None:
        """Register the collectors in ``registry`` (a fresh one by default); with
        ``tenant_labels="names"``, decisions are counted by tenant name too."""
        if tenant_labels not in TENANT_LABELS:
            raise ValueError(f"tenant_labels must be one of {TENANT_LABELS}, got "
                             f"{tenant_labels!r}")
        self.tenant_names = tenant_labels == "names"
        self.registry = registry if registry is not None else CollectorRegistry()
        self.duration = Histogram(
            "fairgate_admission_duration_seconds",
            "Time to answer an AdmissionReview, by webhook and operation.",
            ["webhook", "operation"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "fairgate_admission_decisions_total",
            "Admission decisions by tenant and verdict." if self.tenant_names
            else "Admission decisions by verdict.",
            ["tenant", "verdict"] if self.tenant_names else ["verdict"],
            registry=self.registry,
        )
        self.redis_unavailable = Counter(
            "fairgate_redis_unavailable_total",
            "Admissions answered by the onRedisUnavailable policy because Redis failed.",
            ["policy"],
            registry=self.registry,
        )
        self.overdue = Counter(
            "fairgate_admission_overdue_total",
            "Requests answered by the deadline fallback, by webhook.",
            ["webhook"],
            registry=self.registry,
        )
        self.errors = Counter(
            "fairgate_admission_errors_total",
            "Unexpected errors inside the webhook, answered safely instead of with a 5xx.",
            registry=self.registry,
        )

    def decided(self, tenant: str, verdict: str) -> None:
        """Count one decision (by ``tenant`` only when tenant names are shown)."""
        if self.tenant_names:
            self.decisions.labels(tenant, verdict).inc()
        else:
            self.decisions.labels(verdict).inc()

    def render(self) -> bytes:
        """This registry plus the process-wide one (process metrics, audit write failures)
        in the Prometheus text exposition format."""
        if self.registry is REGISTRY:
            return generate_latest(REGISTRY)
        return generate_latest(self.registry) + generate_latest(REGISTRY)

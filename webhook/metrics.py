"""Prometheus metrics of the admission webhook.

Contract: every :class:`WebhookMetrics` owns its own ``CollectorRegistry`` (so several
apps can live in one process, e.g. in tests); ``/metrics`` shows it together with the
process-wide default registry (process metrics, audit write failures):

- ``fairgate_admission_duration_seconds{webhook, operation}``: histogram of the time
  from a request's arrival to its answer; ``webhook`` is ``mutate`` or ``validate``,
  ``operation`` the AdmissionReview operation (``CREATE``, ``UPDATE``, ...) or
  ``invalid`` for bodies that were refused with a 4xx.
- ``fairgate_admission_decisions_total{tenant, verdict}``: decisions by tenant (empty
  when the namespace has none) and verdict (``admit``, ``queue``, ``deny``, ``allow``).
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


class WebhookMetrics:
    """The webhook's collectors, registered in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Register the collectors in ``registry`` (a fresh one by default)."""
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
            "Admission decisions by tenant and verdict.",
            ["tenant", "verdict"],
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

    def render(self) -> bytes:
        """This registry plus the process-wide one (process metrics, audit write failures)
        in the Prometheus text exposition format."""
        if self.registry is REGISTRY:
            return generate_latest(REGISTRY)
        return generate_latest(self.registry) + generate_latest(REGISTRY)

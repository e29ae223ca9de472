"""``fairgate dispatch``: the dispatcher and reconciler against a real cluster.

Contract: :func:`run_dispatch` watches pods and nodes (official ``kubernetes`` client;
in-cluster credentials, else ``$KUBECONFIG`` / ``~/.kube/config``) and runs
:class:`fairshare.dispatcher.Dispatcher` on the queue in ``redis_target`` until SIGTERM or
SIGINT, then returns 0. Config comes from ``config_dir`` (hot-reloaded) or from the
cluster's ConfigMaps and Namespaces. Dispatch and release decisions are audited to the
Redis Stream ``fairgate:audit`` and stdout. With ``metrics_port`` the dispatcher's
Prometheus metrics are served over plain HTTP on that port (``/metrics``). A node not
Ready for more than ``not_ready_grace`` seconds is not capacity. A released pod the
scheduler reports Unschedulable for more than ``unschedulable_grace`` seconds is caught
(Warning Event, metric, its capacity withheld; see :mod:`fairshare.dispatcher`).
Tenants' budgets are enforced from the month-to-date spend in the audit stream
(:class:`cost.budget.AuditSpend`), billed every ``budget_every`` seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.config import ConfigException
from prometheus_client import start_http_server
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from admission.demand import container_demand, held_demand
from admission.dra import DraContext, ReleaseVerdict, release_check, shared_claims
from admission.pods import PodView
from audit import AuditLog
from audit.log import DEFAULT_RETENTION, Retention
from cost.budget import AuditSpend
from fairshare.cluster.cluster import DEFAULT_NOT_READY_GRACE, DEFAULT_UNSCHEDULABLE_GRACE
from fairshare.cluster.dra import DraWatch
from fairshare.cluster.kube import KubeCluster, ReleaseCheck, SharedOf, api_client
from fairshare.cluster.pod_evict import KubeEvictor
from fairshare.cluster.provisioning import KubeProvisioner
from fairshare.connection import RedisTarget, connect_redis
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.metrics import DispatcherMetrics
from fairshare.queue.budget import DEFAULT_BUDGET_EVERY
from fairshare.queue.fairqueue import FairQueue
from tenants.models import (
    CONTROL_NAMESPACE,
    DEFAULT_DEVICE_CLASSES,
    DEMAND_ANNOTATION,
    FairgateConfig,
    PriorityClasses,
)
from tenants.resources import ResourceCounts, parse_counts
from tenants.source import ConfigNotReadyError, ConfigSource, start_local_source

log = logging.getLogger("fairgate.dispatch")

CONFIG_POLL_SECONDS = 1.0
FIRST_CONFIG_WAIT_SECONDS = 60.0
REDIS_TIMEOUT_SECONDS = 5.0


class DispatchError(RuntimeError):
    """``fairgate dispatch`` cannot start; the message says what to fix."""


def _source(config_dir: Path | None) -> ConfigSource:
    if config_dir is not None:
        try:
            return start_local_source(config_dir, CONFIG_POLL_SECONDS)
        except ConfigNotReadyError as exc:
            raise DispatchError(str(exc)) from exc
    from tenants.cluster import ClusterConfigSource, api_client_from_environment

    namespace = os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE)
    cluster = ClusterConfigSource(_api(api_client_from_environment), namespace)
    cluster.start()
    if not cluster.wait_ready(FIRST_CONFIG_WAIT_SECONDS):
        log.warning("no complete config after %.0fs; dispatching nothing until it loads",
                    FIRST_CONFIG_WAIT_SECONDS)
    return cluster


def _api(make: Callable[[], ApiClient]) -> ApiClient:
    try:
        return make()
    except (ConfigException, OSError) as exc:
        raise DispatchError(
            f"cannot use the cluster ({type(exc).__name__}: {exc}): run in the cluster or "
            "set KUBECONFIG to a working kubeconfig"
        ) from exc


def _current(source: ConfigSource) -> FairgateConfig | None:
    try:
        return source.config
    except ConfigNotReadyError:
        return None


def _context(source: ConfigSource, dra: DraWatch, pod: PodView) -> DraContext:
    """The DRA objects seen now, with the platform's device class rules, for ``pod``."""
    config = _current(source)
    rules = config.platform.device_class_rules if config else DEFAULT_DEVICE_CLASSES
    return DraContext(pod.namespace, rules, dra.objects())


def _demand_of(source: ConfigSource, dra: DraWatch) -> Callable[[PodView], ResourceCounts]:
    """:func:`admission.demand.held_demand` with the platform's rules and the DRA objects
    seen now."""
    def demand_of(pod: PodView) -> ResourceCounts:
        return held_demand(pod, _context(source, dra, pod))

    return demand_of


def _shared_of(source: ConfigSource, dra: DraWatch) -> SharedOf:
    """:func:`admission.dra.shared_claims` with the platform's rules and the DRA objects
    seen now."""
    def shared_of(pod: PodView) -> Mapping[str, ResourceCounts]:
        return shared_claims(pod, _context(source, dra, pod))

    return shared_of


def _release_check(source: ConfigSource, dra: DraWatch) -> ReleaseCheck:
    """:func:`admission.dra.release_check` of a pod manifest against the devices its claims
    were priced at when it was admitted (its demand stamp less its containers')."""
    def check(manifest: Mapping[str, Any]) -> ReleaseVerdict:
        pod = PodView.parse(manifest)
        context = _context(source, dra, pod)
        admitted = parse_counts(pod.annotations.get(DEMAND_ANNOTATION, ""))
        containers = container_demand(pod, context)
        claims = {r: n - containers.get(r, 0) for r, n in admitted.items()}
        return release_check(pod, claims, context)

    return check


def run_dispatch(redis_target: RedisTarget | str, config_dir: Path | None = None,
                 metrics_port: int | None = None,
                 not_ready_grace: float = DEFAULT_NOT_READY_GRACE,
                 unschedulable_grace: float = DEFAULT_UNSCHEDULABLE_GRACE,
                 budget_every: float = DEFAULT_BUDGET_EVERY,
                 audit_retention: Retention = DEFAULT_RETENTION) -> int:
    """Dispatch until SIGTERM/SIGINT (see the module contract); the exit code."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    source = _source(config_dir)
    target = RedisTarget.of(redis_target)
    client = connect_redis(target, REDIS_TIMEOUT_SECONDS,
                           retry=Retry(ExponentialBackoff(cap=2.0), 3))
    config = _current(source)
    priority_classes = config.platform.priority_classes if config else PriorityClasses()
    api = _api(api_client)
    dra = DraWatch(api)
    cluster = KubeCluster(api, priority_classes, demand_of=_demand_of(source, dra),
                          not_ready_grace=not_ready_grace, dra=dra,
                          release_check=_release_check(source, dra),
                          shared_of=_shared_of(source, dra))
    metrics = DispatcherMetrics()
    if metrics_port is not None:
        start_http_server(metrics_port, registry=metrics.registry)
    audit = AuditLog(client, maxlen=audit_retention.max_records,
                     max_age=audit_retention.max_age)
    dispatcher = Dispatcher(FairQueue(client), cluster, lambda: _current(source),
                            metrics=metrics, audit=audit,
                            settings=DispatcherSettings(unschedulable_grace=unschedulable_grace,
                                                        budget_every=budget_every),
                            spend=AuditSpend(audit), provisioner=KubeProvisioner(api),
                            evictor=KubeEvictor(api))
    cluster.start()
    log.info("dispatching from %s", target)
    try:
        dispatcher.run(stop)
    finally:
        cluster.stop()
        source.close()
        client.close()
    return 0

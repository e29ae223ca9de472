"""The webhook's decisions: AdmissionReview in, AdmissionReview out, audited.

Contract (asynchronous; :mod:`webhook.app` awaits it on the event loop under a deadline):

- :meth:`AdmissionService.review` parses a body (raising
  :class:`~admission.reviews.InvalidReview` when it is not an AdmissionReview v1) and
  answers it:

  * ``mutate``, pod CREATE: plan (pure) -> reserve or enqueue in the fair queue (a
    dry-run request changes nothing in Redis) -> note what each ResourceClaim and
    ResourceClaimTemplate the pod names was priced at (one more Redis call, only for a
    pod that names some) -> JSON Patch. A pod without GPU demand
    is allowed untouched (no patch). A queued pod gets the gate and a warning saying
    why it waits. A pod of a tenant whose budget is at 80% or more this month gets a
    warning saying spent, budget, percent and what happens at 100%
    (:mod:`fairshare.queue.budget`). Anything else sent to ``/mutate`` is allowed untouched.
  * ``validate``: pod CREATE/UPDATE rules and quota ConfigMap edits; a ResourceClaim
    or ResourceClaimTemplate CREATE in a tenant namespace that asks for GPUs is refused
    when a live admitted pod named an object of that name and was priced for less
    (:mod:`admission.claimguard`; one Redis call; Redis down: ``onRedisUnavailable``,
    ``deny`` refusing it with 503, ``allow`` letting it through audited); anything else
    is allowed. The check of a fairgate ConfigMap (YAML a tenant admin wrote) runs in a
    worker process under a time budget (:mod:`webhook.checker`): one over the budget is
    refused with :data:`CHECK_BUDGET_MESSAGE`, and pod admissions never wait for it.
  * When Redis fails, ``onRedisUnavailable`` decides: ``deny`` (default) refuses GPU
    pods with :data:`REDIS_DOWN_MESSAGE`; ``allow`` admits them stamped but unreserved,
    with a warning, audited. With ``replicas`` (a Sentinel target) a reservation that
    no replica acknowledged in time counts as a Redis failure too
    (:class:`~fairshare.queue.fastpath.NotReplicatedError`).

- :meth:`overdue` answers a request whose decision missed the deadline (a pod CREATE at
  /mutate as a Redis failure; otherwise :data:`OVERDUE_MESSAGE`, "overloaded") and
  :meth:`failed` one whose decision raised unexpectedly (:data:`INTERNAL_ERROR_MESSAGE`,
  logged with its traceback). Either way a GPU pod (or a pod fairgate cannot read), a
  fairgate ConfigMap edit and, at /validate, a ResourceClaim or ResourceClaimTemplate
  that asks for GPUs (or cannot be priced) are refused; anything else is allowed. Both are
  synchronous and make no Redis call.
- Every decision on a GPU pod (admit, queue, deny) and every denial or accepted quota
  change is audited (:mod:`audit`, written off the request path) and counted in
  ``fairgate_admission_decisions_total``. Responses carry ``auditAnnotations``
  ``decision``, ``tenant``, ``reason`` (a short tag such as ``never-fits``); a denial's
  audit record keeps class and demand when known, and its reason is the tag, ``: `` and
  the message the user got.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import redis
import redis.asyncio

from admission.claimguard import (
    CreatedObject,
    asked,
    created_object,
    made_for_a_pod,
    priced_objects,
    swap_refusal,
)
from admission.demand import pod_demand
from admission.dra import NO_OBJECTS, DraContext, DraObjects
from admission.gangs import NO_GANG_OBJECTS, GangObjects
from admission.mutation import build_patch
from admission.plan import Denied, NotOurs, PodGroup, PodPlan, plan_create
from admission.pods import PodError, PodView, admitted_name
from admission.reviews import (
    MAX_WARNING_CHARS,
    AdmissionRequest,
    AdmissionReview,
    AdmissionReviewResponse,
    allow,
    deny,
    parse_review,
    with_patch,
)
from admission.validation import validate_create, validate_update
from audit import ADMIT, DENY, QUEUE, QUOTA_CHANGE, AuditLog
from audit.chain import format_time
from fairshare.queue.budget import BudgetStatus, budget_warning
from fairshare.queue.calls import (
    TicketConflictError,
    UnknownTenantError,
    UnmintedTicketError,
    gang_reason,
    gang_wait,
)
from fairshare.queue.fastpath import REPLICA_ACK_TIMEOUT, AsyncFairQueue, NotReplicatedError
from fairshare.queue.model import (
    UNKNOWN_GANG_SIZE,
    Admission,
    InvalidRequestError,
    PodRequest,
    gang_name,
)
from tenants import resources
from tenants.configmaps import is_fairgate_configmap, quota_tenant, review_configmap
from tenants.models import DEFAULT_DEVICE_CLASSES, FairgateConfig, PriorityBand
from tenants.resources import ResourceCounts
from tenants.source import ConfigNotReadyError, ConfigSource
from webhook.auditing import AuditWriter
from webhook.checker import CheckOverBudget, ConfigMapChecker
from webhook.metrics import WebhookMetrics

log = logging.getLogger("fairgate.webhook")

Webhook = Literal["mutate", "validate"]

REDIS_DOWN_MESSAGE = (
    "fairgate cannot reach its queue (Redis): GPU pods are refused until it is back; "
    "ask the platform team"
)
NO_CONFIG_MESSAGE = (
    "fairgate has not loaded its tenant config yet: GPU pods are refused until it has; "
    "retry in a minute or ask the platform team"
)
OVERDUE_MESSAGE = (
    "fairgate could not decide on this request within its {seconds:g} s deadline (the "
    "webhook is overloaded): it is refused rather than admitted unchecked; retry"
)
INTERNAL_ERROR_MESSAGE = (
    "fairgate could not decide on this request because of an internal error (logged with "
    "uid {uid}): it is refused rather than admitted unchecked; retry, or ask the platform "
    "team"
)
CHECK_BUDGET_MESSAGE = (
    "fairgate refuses this change to ConfigMap {name}: it was {reason} (documents this "
    "costly to parse are refused); keep it to the few keys fairgate reads (see "
    "docs/install.md), or retry if many ConfigMap edits are under way"
)
CONFIG_EDITS_REFUSED = (
    "some config objects could not be used: the last good version of each serves (which "
    "and why: the webhook's log, and Events on the ConfigMaps)"
)
FAIL_OPEN_WARNING = (
    "fairgate queue (Redis) unavailable: admitted without a quota check "
    "(onRedisUnavailable: allow)"
)
DRA_REDIS_DOWN_MESSAGE = (
    "fairgate cannot reach its queue (Redis), so it cannot check that this {kind} gives "
    "no admitted pod more GPUs than it was priced for: {kind}s that ask for GPUs are "
    "refused until it is back; retry, or ask the platform team"
)
DRA_NO_CONFIG_MESSAGE = (
    "fairgate has not loaded its tenant config yet: {kind}s that ask for GPUs are refused "
    "until it has; retry in a minute or ask the platform team"
)
DRA_FAIL_OPEN_WARNING = (
    "Redis unavailable: created unchecked against the pods admitted under this name "
    "(onRedisUnavailable: allow)"
)

GANG_SIZES_SECONDS = 2.0
"""How often the webhook gives the gangs queued before their size object was seen the
size its watches have seen since (:meth:`AdmissionService.size_gangs`)."""

BUDGET_REFRESH_SECONDS = 5.0
"""How often the webhook reads the tenants' budget states (the dispatcher updates them
every ``budget_every`` seconds, 60 by default)."""

# Redis did not answer, or cannot store anything (out of memory, a read-only replica), or
# no replica acknowledged the write in time. Any other ResponseError is an answer: a bug,
# handled as an internal error.
_UNAVAILABLE = (
    NotReplicatedError,
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    OSError,
)


@dataclass
class Progress:
    """How far a decision got; read by the deadline and error fallbacks.

    ``abandoned`` is set when the deadline passed and a fallback answered instead: a
    decision still running then records nothing (no second audit record).
    """

    started: float
    review: AdmissionReview | None = None
    plan: PodPlan | None = None
    config: FairgateConfig | None = None
    abandoned: bool = False


@dataclass(frozen=True)
class _Decision:
    """One decision, as audited, logged and counted."""

    verdict: str
    reason: str
    tenant: str = ""
    pod_class: str = ""
    demand: str = ""
    diff: Mapping[str, Mapping[str, Any]] | None = None
    message: str = ""  # a denial's: what the user was told

    @property
    def audited_reason(self) -> str:
        """The audit record's reason: the tag, then the message the user got, if other."""
        if not self.message or self.message == self.reason:
            return self.reason
        return f"{self.reason}: {self.message}"


def _planned(verdict: str, reason: str, plan: PodPlan | None) -> _Decision:
    """A decision about a planned pod (tenant, class and demand known)."""
    if plan is None:
        return _Decision(verdict, reason)
    return _Decision(
        verdict,
        reason,
        tenant=plan.tenant.name,
        pod_class=plan.pod_class,
        demand=resources.format_counts(plan.demand),
    )


def _is_pod(request: AdmissionRequest) -> bool:
    return request.kind.group == "" and request.kind.kind == "Pod" and not request.sub_resource


def _is_configmap(request: AdmissionRequest) -> bool:
    return request.kind.group == "" and request.kind.kind == "ConfigMap"


def _created_dra_object(request: AdmissionRequest) -> CreatedObject | None:
    """The ResourceClaim or ResourceClaimTemplate a CREATE makes, else None."""
    if request.operation != "CREATE" or request.sub_resource:
        return None
    return created_object(request.kind.group, request.kind.kind, request.namespace,
                          request.name, request.object)


class DraSource(Protocol):
    """The cluster's DRA objects, as :class:`fairshare.cluster.dra.DraWatch` keeps them."""

    def objects(self) -> DraObjects:
        """The objects seen now (never blocks)."""

    def objects_for(self, pod: PodView, namespace: str) -> DraObjects:
        """The objects seen now, completed with what ``pod`` names (may read the API)."""


class GangSource(Protocol):
    """The objects giving gangs their size, as :class:`fairshare.cluster.gangs.GangWatch`
    keeps them."""

    def objects(self) -> GangObjects:
        """The objects seen now (never blocks)."""

    def sizes(self) -> Mapping[str, int]:
        """Gang id (``namespace/key``) -> size, of every gang those objects declare."""


def asks_for_gpu(pod: PodView | None, namespace: str, dra: DraObjects) -> bool:
    """Whether a pod asks for GPUs (DRA classes by the default rules); a pod that cannot
    be read (None: not parsed) counts as asking."""
    if pod is None:
        return True
    try:
        return bool(pod_demand(pod, DraContext(namespace, objects=dra)))
    except Exception:
        return True


def gang_source(group: PodGroup | None) -> str:
    """Where a pod's gang was declared, for the queue's words: the plan's source (e.g.
    ``Indexed Job trainer``), ``pod group <name>`` for fairgate's own label, ``""``
    without a gang."""
    if group is None:
        return ""
    return group.source or f"pod group {group.name}"


def _shortened(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters (at least 8), cut with ``...``."""
    room = max(room, 8)
    return text if len(text) <= room else text[:room - 3].rstrip() + "..."


def parsed(obj: object) -> PodView | None:
    """A pod (a request's, a template's) parsed once, None when it cannot be read (the
    core then refuses it, naming the field)."""
    try:
        return PodView.parse(obj)
    except PodError:
        return None


def _queued_warning(plan: PodPlan, admission: Admission) -> str:
    """One sentence, e.g. ``Queued as borrowed, 3rd of 12 training pods of team-a,
    waiting for 1.00 GPU-eq of borrow limit.``: only what the queue said (no quota
    arithmetic of its own), within the API server's 120-character advice: a gang
    member's place in the queue, then its gang (``with its gang of Indexed Job trainer (4
    pods)``), is left out when the sentence would be longer, and a reason still too
    long is cut at a word by the response builder. A member of a gang still
    incomplete says which gang and how far it got, its source shortened to fit: ``Queued
    as training, waiting for the 4th pod of gang of Indexed Job trainer (3 of 4 pods
    created).``"""
    if admission.reason[:1] == ("gang",) and len(admission.reason) >= 4:
        gang, created, size, source, awaiting = gang_reason(admission.reason[1:])
        source = source or gang_source(plan.group) or gang
        head = f"Queued as {admission.band}, waiting for "
        room = MAX_WARNING_CHARS - len(head) - 1  # the full stop

        def wait(said: str) -> str:  # the size's object is left out: it names the gang again
            if size is None:
                made = "1 pod" if created == 1 else f"{created} pods"
                return f"the size of {gang_name(gang, said)} ({made} created)"
            return gang_wait(gang, created, size, said)

        text = gang_wait(gang, created, size, source, awaiting)
        if len(text) > room:
            text = wait(source)
        if len(text) > room:
            text = wait(_shortened(source, len(source) - (len(text) - room)))
        return f"{head}{text}."
    where = (f", {_ordinal(admission.position)} of {admission.queue_length} "
             f"{plan.pod_class} pods of {plan.tenant.name}"
             if admission.position is not None else f" in {plan.tenant.name}")
    waits = admission.waiting_for or "its turn"
    if admission.reason[:1] == ("never",):  # the queue's words name the rule; these fit
        waits = "a larger quota: it never fits the tenant's nominal quota and borrow limit"
    group = plan.group
    gang = (f" with its {gang_name('', gang_source(group))} ({group.size} pods)"
            if group is not None and group.size is not None and group.size > 1 else "")
    # the first that fits: where it stands, then its gang, are the parts to leave out
    candidates = [f"Queued as {admission.band}{gang}{where}, waiting for {waits}.",
                  f"Queued as {admission.band}{gang}, waiting for {waits}.",
                  f"Queued as {admission.band}{where}, waiting for {waits}.",
                  f"Queued as {admission.band}, waiting for {waits}."]
    return next((c for c in candidates if len(c) <= MAX_WARNING_CHARS), candidates[-1])


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class AdmissionService:
    """Decides admission requests with a config provider, a fair queue and an audit log."""

    def __init__(
        self,
        config: ConfigSource,
        client: redis.asyncio.Redis,
        audit_log: AuditLog,
        *,
        metrics: WebhookMetrics | None = None,
        clock: Callable[[], float] = time.time,
        wait_for_rebuild: bool = False,
        checker: ConfigMapChecker | None = None,
        replicas: int = 0,
        replica_timeout: float = REPLICA_ACK_TIMEOUT,
        budget_refresh: float = BUDGET_REFRESH_SECONDS,
        dra: DraSource | None = None,
        gangs: GangSource | None = None,
    ) -> None:
        """Decide with ``config`` and the queue in Redis ``client``.

        fairgate's ConfigMaps are checked by ``checker`` (default: a
        :class:`~webhook.checker.ConfigMapChecker` with its default budget).
        Audit records go to ``audit_log`` (written by a background thread);
        ``clock`` (epoch seconds) orders the queue and, when it is not the wall clock
        (``fairgate demo``'s virtual time), times the audit records too. With
        ``wait_for_rebuild`` nothing is reserved at admission on a Redis whose usage the
        reconciler has not rebuilt (fresh, or restarted empty): GPU pods are queued
        behind the gate until it has (see :class:`fairshare.queue.fairqueue.FairQueue`).
        A reservation is answered only once ``replicas`` replicas hold it, waiting at
        most ``replica_timeout`` seconds (see :class:`fairshare.queue.fastpath.AsyncFairQueue`).
        The tenants' budget states (the dispatcher's) are read at most every
        ``budget_refresh`` seconds. A pod's GPUs through DRA are counted with the
        objects of ``dra`` (None: a cluster without DRA objects, e.g. a local config dir);
        the gangs pods declare through other tools are sized from ``gangs`` (None: only
        the sources that need no object are read).
        """
        self.config = config
        self.dra = dra
        self.gangs = gangs
        self.client = client
        self.queue = AsyncFairQueue(client, wait_for_rebuild=wait_for_rebuild,
                                    replicas=replicas, replica_timeout=replica_timeout)
        self.metrics = metrics if metrics is not None else WebhookMetrics()
        self.audit = AuditWriter(audit_log)
        self.checker = checker if checker is not None else ConfigMapChecker()
        self._clock = clock
        # The audit record's own time (the wall clock's, cheaper) unless the clock is other.
        self._audit_time: Callable[[], dict[str, str]] = dict if clock is time.time else (
            lambda: {"time": format_time(datetime.fromtimestamp(clock(), UTC))})
        self._synced: FairgateConfig | None = None
        self.budget_refresh = budget_refresh
        self._budgets: dict[str, BudgetStatus] = {}
        self._budgets_read = float("-inf")  # time.monotonic() of the last read
        self._redis_down: str | None = None  # the last readiness failure, logged once

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the audit writer and the ConfigMap checker's worker process."""
        self.audit.start()
        self.checker.start()

    def stop(self) -> None:
        """Write the audit records still queued; stop the ConfigMap checker."""
        self.checker.stop()
        self.audit.stop()

    def current_config(self) -> FairgateConfig | None:
        """The config snapshot to decide with, None before the first full load."""
        try:
            return self.config.config
        except ConfigNotReadyError:
            return None

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when Redis answers a PING and a config is loaded. The detail is for
        anyone who can reach the port, so it says which part is missing in general terms
        only: never a tenant's name, a quota's numbers or an error's text. Those go to the
        log (once per change) and, in a cluster, to Events on the ConfigMap."""
        config_ok = self.config.ready
        detail: dict[str, Any] = {
            "config": "loaded" if config_ok else "not loaded",
            "config_generation": self.config.generation,
        }
        if self.config.last_error:
            detail["config_edits"] = CONFIG_EDITS_REFUSED
        try:
            await self.client.ping()
            detail["redis"] = "ok"
            redis_ok = True
        except (redis.RedisError, OSError) as exc:
            detail["redis"] = "unreachable"
            if self._redis_down != str(exc):
                log.warning("readiness: Redis unreachable (%s: %s)", type(exc).__name__, exc)
            self._redis_down = str(exc)
            redis_ok = False
        else:
            self._redis_down = None
        return config_ok and redis_ok, detail

    # -- DRA ---------------------------------------------------------------------

    def _dra_now(self) -> DraObjects:
        return NO_OBJECTS if self.dra is None else self.dra.objects()

    async def _dra_for(self, pod: PodView | None, namespace: str) -> DraObjects:
        """The DRA objects ``pod``'s demand depends on (reads the API only for a
        template or claim the watches have not delivered yet, off the event loop)."""
        if self.dra is None:
            return NO_OBJECTS
        if pod is None or not pod.claims:
            return self.dra.objects()
        return await asyncio.to_thread(self.dra.objects_for, pod, namespace)

    def _refused_when_undecided(self, webhook: Webhook, request: AdmissionRequest) -> bool:
        """Whether a request fairgate could not decide must be refused: a GPU pod (or one
        fairgate cannot read) and, at /validate, a ConfigMap; anything else passes."""
        if _is_pod(request):
            return asks_for_gpu(parsed(request.object or request.old_object), request.namespace,
                                 self._dra_now())
        created = _created_dra_object(request)
        if created is not None:
            if webhook != "validate":
                return False
            try:
                return self._judged(created, request.user_info.username,
                                    self.current_config()) is not None
            except Exception:  # an object fairgate cannot read counts as asking
                return True
        return _is_configmap(request) and webhook == "validate"

    def _judged(self, created: CreatedObject, username: str,
                config: FairgateConfig | None) -> ResourceCounts | PodError | None:
        """What a created ResourceClaim or ResourceClaimTemplate asks (its devices, or why
        it cannot be priced) when it must be checked against the admitted pods; None when
        it asks for no GPU or the resourceclaim controller made it for a pod."""
        rules = (config.platform.device_class_rules if config is not None
                 else dict(DEFAULT_DEVICE_CLASSES))
        asks = asked(created, DraContext(created.ref.namespace, rules, self._dra_now()))
        if (not isinstance(asks, PodError) and not asks) or made_for_a_pod(created, username):
            return None
        return asks

    # -- entry points --------------------------------------------------------------

    async def review(
        self, webhook: Webhook, body: bytes, progress: Progress
    ) -> AdmissionReviewResponse:
        """Parse ``body`` and answer it (see the module contract)."""
        review = parse_review(body)
        progress.review = review
        request = review.request
        if webhook == "mutate":
            return await self._mutate(request, progress)
        return await self._validate(request, progress)

    def overdue(
        self, webhook: Webhook, body: bytes, progress: Progress, seconds: float
    ) -> AdmissionReviewResponse:
        """The answer for a decision that missed its ``seconds`` deadline: for a pod
        CREATE at /mutate, the ``onRedisUnavailable`` policy (Redis is the likely cause);
        otherwise a GPU pod or a fairgate ConfigMap is refused as overloaded."""
        progress.abandoned = True  # the late worker's own decision is not recorded
        progress = replace(progress, abandoned=False)
        review = progress.review or parse_review(body)
        progress.review = review
        request = review.request
        self.metrics.overdue.labels(webhook).inc()
        log.warning("no decision within %g s for /%s uid=%s", seconds, webhook, request.uid)
        if not self._refused_when_undecided(webhook, request):
            return allow(request.uid)
        if webhook == "mutate" and request.operation == "CREATE":
            return self._redis_unavailable(request, progress, TimeoutError("deadline"))
        plan = progress.plan
        return self._deny(
            request,
            progress,
            _Decision(DENY, "deadline exceeded", tenant=plan.tenant.name if plan else ""),
            OVERDUE_MESSAGE.format(seconds=seconds),
            code=503,
            reason="ServiceUnavailable",
        )

    def failed(
        self, webhook: Webhook, body: bytes, progress: Progress, error: BaseException
    ) -> AdmissionReviewResponse:
        """The answer for a decision that raised ``error`` unexpectedly."""
        self.metrics.errors.inc()
        review = progress.review or parse_review(body)
        request = review.request
        log.error(
            "unexpected error deciding /%s uid=%s kind=%s ns=%s",
            webhook, request.uid, request.kind.kind, request.namespace,
            exc_info=(type(error), error, error.__traceback__),
        )
        if not self._refused_when_undecided(webhook, request):
            return allow(request.uid)
        message = INTERNAL_ERROR_MESSAGE.format(uid=request.uid)
        plan = progress.plan
        return self._deny(
            request,
            progress,
            _Decision(DENY, "internal error", tenant=plan.tenant.name if plan else ""),
            message,
            code=500,
            reason="InternalError",
        )

    # -- mutate --------------------------------------------------------------------

    async def _mutate(
        self, request: AdmissionRequest, progress: Progress
    ) -> AdmissionReviewResponse:
        if not (_is_pod(request) and request.operation == "CREATE"):
            return allow(request.uid)
        pod = parsed(request.object)
        config = self.current_config()
        dra = await self._dra_for(pod, request.namespace)
        if config is None:
            if not asks_for_gpu(pod, request.namespace, dra):
                return allow(request.uid)
            return self._deny(request, progress, _Decision(DENY, "config not loaded"),
                              NO_CONFIG_MESSAGE,
                              code=503, reason="ServiceUnavailable")
        progress.config = config
        gangs = NO_GANG_OBJECTS if self.gangs is None else self.gangs.objects()
        plan = plan_create(pod or request.object, request.namespace, request.uid, config, dra,
                           gangs)
        if isinstance(plan, NotOurs):
            return allow(request.uid)
        if isinstance(plan, Denied):
            tenant = config.tenant_of_namespace(request.namespace) or ""
            decision = _Decision(DENY, plan.code, tenant=tenant, pod_class=plan.pod_class,
                                 demand=resources.format_counts(plan.demand))
            return self._deny(request, progress, decision, plan.message)
        progress.plan = plan
        try:
            queued = PodRequest(
                ticket=plan.ticket,
                tenant=plan.tenant.name,
                namespace=request.namespace,
                name=request.name or _generate_name(request.object),
                pod_class=plan.pod_class,
                demand=plan.placement.keyed(plan.demand),
                group=plan.group.name if plan.group else None,
                group_size=(1 if plan.group is None else plan.group.size or UNKNOWN_GANG_SIZE),
                submitted_at=self._clock(),
                hold=bool(plan.priced_claims),
                group_source=gang_source(plan.group),
                group_awaiting=plan.group.awaiting if plan.group else "",
                run_seconds=plan.run_seconds,
            )
            admission = await self._admit(config, queued, request.dry_run, plan.reused_ticket)
        except InvalidRequestError as exc:  # e.g. a gang mixing classes or tenants
            return self._deny(request, progress, _planned(DENY, "invalid-request", plan),
                              f"fairgate cannot queue this pod: {exc}")
        except _UNAVAILABLE as exc:
            return self._redis_unavailable(request, progress, exc)
        except TicketConflictError as exc:
            return self._deny(request, progress, _planned(DENY, "copied-ticket", plan),
                              f"fairgate refuses this pod: {exc}")
        except UnmintedTicketError as exc:
            return self._deny(request, progress, _planned(DENY, "unminted-ticket", plan),
                              f"fairgate refuses this pod: {exc}")
        unnoted = await self._note_priced(request, progress, pod, plan.ticket, config, dra)
        if unnoted is not None:
            return unnoted
        gated = admission.outcome == "queued"
        ops = build_patch(_pod(request.object), plan, admission.band, gated,
                          config.platform.priority_classes)
        warnings = list(plan.warnings)
        budget = await self._budget_warning(plan.tenant.name)
        if budget is not None:
            warnings.append(budget)
        if gated:
            warnings.append(_queued_warning(plan, admission))
            decision = _planned(QUEUE, f"waiting for {admission.waiting_for}", plan)
        else:
            decision = _planned(ADMIT, f"reserved as {admission.band}", plan)
        return with_patch(request.uid, ops, warnings, self._record(request, decision, progress))

    async def _admit(
        self, config: FairgateConfig, queued: PodRequest, dry_run: bool, presented: bool
    ) -> Admission:
        """Ask the queue, syncing the config into Redis first when it is new to it;
        ``presented``: the pod carries its ticket itself (see ``FairQueue.admit``)."""
        if self._synced is not config:
            await self._sync(config)
        try:
            return await self.queue.admit(queued, queued.submitted_at, dry_run=dry_run,
                                          presented=presented)
        except UnknownTenantError:
            # Redis lost its state (restarted empty, flushed): give it the config again.
            await self._sync(config)
            return await self.queue.admit(queued, queued.submitted_at, dry_run=dry_run,
                                          presented=presented)

    async def _note_priced(
        self, request: AdmissionRequest, progress: Progress, pod: PodView | None, ticket: str,
        config: FairgateConfig, dra: DraObjects,
    ) -> AdmissionReviewResponse | None:
        """Note in the queue what each ResourceClaim and ResourceClaimTemplate the pod
        names was priced at, under its ``ticket`` (one call; none for a dry run or a pod
        that names none); a Redis failure is answered as at admission, else None."""
        if request.dry_run or pod is None:
            return None
        context = DraContext(request.namespace, config.platform.device_class_rules, dra)
        priced = priced_objects(pod, context)
        if not priced:
            return None
        try:
            await self.queue.note_priced(ticket, {ref.key: n for ref, n in priced.items()})
        except _UNAVAILABLE as exc:
            return self._redis_unavailable(request, progress, exc)
        return None

    async def size_gangs(self) -> int:
        """Give the gangs queued before the object declaring their size was seen the
        size the watches know now; returns how many were resized (a gang whose object is
        still unseen keeps waiting, and ``fairgate why`` says so)."""
        if self.gangs is None:
            return 0
        waiting = await self.queue.unsized()
        if not waiting:
            return 0
        known = self.gangs.sizes()
        return await self.queue.resize({gid: known[gid] for gid in waiting if gid in known})

    async def size_gangs_forever(self, every: float = GANG_SIZES_SECONDS) -> None:
        """:meth:`size_gangs` every ``every`` seconds until cancelled; a Redis failure is
        logged and tried again next time."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.size_gangs()
            except (*_UNAVAILABLE, redis.ResponseError) as exc:
                log.warning("gang sizes not given to the queue (%s): retrying", exc)

    async def _budget_warning(self, tenant: str) -> str | None:
        """The budget warning of ``tenant`` (:func:`fairshare.queue.budget.budget_warning`),
        from the budget states read at most every :attr:`budget_refresh` seconds (one
        HGETALL, not one per admission). A failed read keeps the states last read."""
        now = time.monotonic()
        if now - self._budgets_read >= self.budget_refresh:
            self._budgets_read = now
            try:
                self._budgets = await self.queue.budgets()
            except _UNAVAILABLE as exc:
                log.warning("budget states not read (%s): using the last ones", exc)
        status = self._budgets.get(tenant)
        return budget_warning(status) if status is not None else None

    async def _sync(self, config: FairgateConfig) -> None:
        """Store the config in the queue. Capacity is the platform's override, else the
        one the dispatcher stored (it alone sees the nodes): never wiped from here."""
        await self.queue.sync_config(config, dict(config.platform.capacity) or None)
        self._synced = config

    def _redis_unavailable(
        self, request: AdmissionRequest, progress: Progress, error: BaseException
    ) -> AdmissionReviewResponse:
        config = progress.config or self.current_config()
        policy = self._unavailable_policy(request, progress, config, error)
        plan = progress.plan
        if policy == "allow" and plan is not None and config is not None:
            band: PriorityBand = "inference" if plan.pod_class == "inference" else "training"
            ops = build_patch(
                _pod(request.object), plan, band, False, config.platform.priority_classes
            )
            decision = _planned(ADMIT, "redis unavailable: admitted unchecked (fail open)", plan)
            return with_patch(
                request.uid,
                ops,
                [*plan.warnings, FAIL_OPEN_WARNING],
                self._record(request, decision, progress),
            )
        return self._deny(
            request, progress, _planned(DENY, "redis unavailable", plan), REDIS_DOWN_MESSAGE,
            code=503, reason="ServiceUnavailable",
        )

    def _unavailable_policy(
        self, request: AdmissionRequest, progress: Progress, config: FairgateConfig | None,
        error: BaseException,
    ) -> str:
        """``onRedisUnavailable`` (``deny`` without a config), counted and logged."""
        policy = config.platform.on_redis_unavailable if config is not None else "deny"
        if progress.abandoned:
            # The deadline fallback answered this request already (and counted and logged
            # it): this late answer is discarded, so it is neither counted nor logged as one.
            log.info("late decision for uid=%s, answered at the deadline, also found Redis "
                     "unavailable (%s)", request.uid, error)
        else:
            self.metrics.redis_unavailable.labels(policy).inc()
            log.warning("Redis unavailable for uid=%s (%s): policy %s", request.uid, error,
                        policy)
        return policy

    # -- validate ------------------------------------------------------------------

    async def _validate(
        self, request: AdmissionRequest, progress: Progress
    ) -> AdmissionReviewResponse:
        if _is_pod(request) and request.operation in ("CREATE", "UPDATE"):
            return await self._validate_pod(request, progress)
        if _is_configmap(request):
            return await self._validate_configmap(request, progress)
        created = _created_dra_object(request)
        if created is not None:
            return await self._validate_dra_object(request, progress, created)
        return allow(request.uid)

    async def _validate_dra_object(
        self, request: AdmissionRequest, progress: Progress, created: CreatedObject
    ) -> AdmissionReviewResponse:
        """A ResourceClaim or ResourceClaimTemplate CREATE: refused when it asks for more
        than a live admitted pod that named its name was priced for (one Redis call, only
        for one that asks for GPUs in a tenant namespace)."""
        config = self.current_config()
        kind = created.ref.kind
        asks = self._judged(created, request.user_info.username, config)
        if asks is None:
            return allow(request.uid)
        demand = "" if isinstance(asks, PodError) else resources.format_counts(asks)
        if config is None:
            return self._deny(request, progress, _Decision(DENY, "config not loaded"),
                              DRA_NO_CONFIG_MESSAGE.format(kind=kind),
                              code=503, reason="ServiceUnavailable")
        tenant = config.tenant_of_namespace(request.namespace)
        if not tenant:
            return allow(request.uid)
        try:
            admitted = await self.queue.priced_for(created.ref.key)
        except _UNAVAILABLE as exc:
            policy = self._unavailable_policy(request, progress, config, exc)
            if policy == "allow":
                decision = _Decision(ADMIT, "redis unavailable: allowed unchecked (fail open)",
                                     tenant=tenant, demand=demand)
                return allow(request.uid, [DRA_FAIL_OPEN_WARNING],
                             self._record(request, decision, progress))
            return self._deny(request, progress,
                              _Decision(DENY, "redis unavailable", tenant=tenant, demand=demand),
                              DRA_REDIS_DOWN_MESSAGE.format(kind=kind),
                              code=503, reason="ServiceUnavailable")
        message = swap_refusal(created.ref, asks, admitted)
        if message is not None:
            return self._deny(request, progress,
                              _Decision(DENY, "replaced-object", tenant=tenant, demand=demand),
                              message)
        if not admitted:
            return allow(request.uid)
        decision = _Decision(ADMIT, f"made again within the price of {len(admitted)} "
                             "admitted pod(s)", tenant=tenant, demand=demand)
        return allow(request.uid, audit=self._record(request, decision, progress))

    async def _validate_configmap(
        self, request: AdmissionRequest, progress: Progress
    ) -> AdmissionReviewResponse:
        config = self.current_config()
        new, old = request.object, request.old_object
        if config is None:
            return self._deny(request, progress, _Decision(DENY, "config not loaded"),
                              "fairgate has not loaded its config yet: retry in a minute")
        metadata = _metadata(new) or _metadata(old)
        user = request.user_info
        name = request.name or str(metadata.get("name") or "")
        namespace = request.namespace or str(metadata.get("namespace") or "")
        arguments: dict[str, Any] = {
            "operation": request.operation, "name": name, "namespace": namespace,
            "new_data": _data(new), "old_data": _data(old), "username": user.username,
            "groups": tuple(user.groups), "labels": _labels(new), "current": config,
            "generate_name": str(metadata.get("generateName") or ""),
        }
        if not is_fairgate_configmap(name, namespace):  # decided without reading any YAML
            verdict = review_configmap(**arguments)
        else:
            try:
                verdict = await self.checker.review(
                    **arguments, usage_slices_by_tenant=await self._usage())
            except CheckOverBudget as exc:
                message = CHECK_BUDGET_MESSAGE.format(name=f"{namespace}/{name}", reason=exc)
                decision = _Decision(DENY, "check over budget", tenant=quota_tenant(name) or "")
                return self._deny(request, progress, decision, message)
        if not verdict.ours:
            return allow(request.uid)
        tenant = verdict.tenant or ""
        if not verdict.allowed:
            return self._deny(request, progress, _Decision(DENY, verdict.message, tenant=tenant),
                              verdict.message, warnings=verdict.warnings)
        decision = _Decision(QUOTA_CHANGE, f"{request.operation.lower()} accepted",
                             tenant=tenant, diff=verdict.audit_diff)
        return allow(request.uid, verdict.warnings, self._record(request, decision, progress))

    async def _usage(self) -> dict[str, int] | None:
        """Slices in use per tenant, or None when Redis cannot say right now."""
        try:
            return {t.tenant: t.used_slices for t in await self.queue.tenant_status()}
        except (*_UNAVAILABLE, redis.ResponseError):
            return None

    async def _validate_pod(
        self, request: AdmissionRequest, progress: Progress
    ) -> AdmissionReviewResponse:
        config = self.current_config()
        pod = parsed(request.object)
        dra = await self._dra_for(pod, request.namespace)
        if config is None:
            if not asks_for_gpu(pod, request.namespace, dra):
                return allow(request.uid)
            return self._deny(request, progress, _Decision(DENY, "config not loaded"),
                              NO_CONFIG_MESSAGE,
                              code=503, reason="ServiceUnavailable")
        user = request.user_info
        if request.operation == "CREATE":
            verdict = validate_create(pod or request.object, request.namespace, config, dra)
        else:
            verdict = validate_update(
                request.old_object, pod or request.object, user.username, tuple(user.groups),
                config,
            )
        if verdict.allowed and request.operation == "CREATE" and verdict.ticket:
            tenant = config.tenant_of_namespace(request.namespace) or ""
            return await self._claim(request, progress, tenant, verdict.ticket,
                                     verdict.warnings)
        if verdict.allowed:
            return allow(request.uid, verdict.warnings)
        tenant = config.tenant_of_namespace(request.namespace) or ""
        decision = _Decision(DENY, verdict.reason, tenant=tenant)
        return self._deny(request, progress, decision, verdict.reason,
                          warnings=verdict.warnings)

    async def _claim(
        self, request: AdmissionRequest, progress: Progress, tenant: str, ticket: str,
        warnings: Sequence[str],
    ) -> AdmissionReviewResponse:
        """Claim ``ticket`` for the pod of ``tenant`` being created (its uid, before it is
        stored), or refuse the pod when another pod owns the ticket (copied stamps)."""
        metadata = _metadata(request.object)
        uid = str(metadata.get("uid") or "")
        name = request.name or str(metadata.get("name") or "")
        if not uid or not name:  # the API server sets both before validation
            return allow(request.uid, warnings)
        try:
            await self.queue.bind(ticket, uid, request.namespace, name, request.dry_run)
        except TicketConflictError as exc:
            return self._deny(request, progress, _Decision(DENY, "copied-ticket", tenant=tenant),
                              f"fairgate refuses this pod: {exc}")
        except _UNAVAILABLE as exc:
            return self._redis_unavailable(request, progress, exc)
        return allow(request.uid, warnings)

    # -- answers -------------------------------------------------------------------

    def _deny(
        self,
        request: AdmissionRequest,
        progress: Progress,
        decision: _Decision,
        message: str,
        *,
        code: int = 403,
        reason: str = "Forbidden",
        warnings: Sequence[str] = (),
    ) -> AdmissionReviewResponse:
        audit = self._record(request, replace(decision, message=message), progress)
        return deny(request.uid, message, code=code, reason=reason, warnings=warnings,
                    audit=audit)

    def _record(
        self, request: AdmissionRequest, decision: _Decision, progress: Progress
    ) -> dict[str, str]:
        """Count and audit ``decision``; return its ``auditAnnotations``.

        Dry-run requests are counted but not audited (they change nothing).
        """
        annotations = {
            "decision": decision.verdict,
            "tenant": decision.tenant,
            "reason": decision.reason,
        }
        if progress.abandoned:
            return annotations
        self.metrics.decided(decision.tenant, decision.verdict)
        latency_ms = (time.perf_counter() - progress.started) * 1000
        if not request.dry_run:
            self.audit.submit(
                decision.verdict,
                **self._audit_time(),
                uid=request.uid,
                user=request.user_info.username,
                groups=tuple(request.user_info.groups),
                operation=request.operation,
                tenant=decision.tenant,
                namespace=request.namespace,
                name=request.name or _generate_name(request.object),
                pod_class=decision.pod_class,
                demand=decision.demand,
                reason=decision.audited_reason,
                latency_ms=latency_ms,
                diff=decision.diff,
            )
        return annotations


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if obj is not None else None
    return metadata if isinstance(metadata, Mapping) else {}


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str] | None:
    if obj is None:
        return None
    labels = _metadata(obj).get("labels")
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): v for k, v in labels.items() if isinstance(v, str)}


def _data(obj: Mapping[str, Any] | None) -> Mapping[str, str] | None:
    """A ConfigMap's ``data`` (None when there is no object; non-strings dropped)."""
    if obj is None:
        return None
    data = obj.get("data")
    if not isinstance(data, Mapping):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}


def _pod(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if obj is None:  # plan_create never plans a pod it cannot read
        raise ValueError("pod CREATE without an object")
    return obj


def _generate_name(obj: Mapping[str, Any] | None) -> str:
    """The name an object is admitted under (:func:`admission.pods.admitted_name`): its
    ``metadata.name``, or ``<generateName as the API server cuts it>*``."""
    metadata = _metadata(obj)
    return admitted_name(str(metadata.get("name") or ""),
                         str(metadata.get("generateName") or ""))

"""The webhook's HTTP surface: ``/mutate``, ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``.

Contract (AdmissionReview v1, as the API server requires):

- ``POST /mutate`` and ``POST /validate`` answer every well-formed AdmissionReview v1
  with HTTP 200 and a response review echoing the request ``uid``; only ``/mutate``
  ever carries a patch (base64 JSON Patch, ``patchType: JSONPatch``).
- A body that is not an AdmissionReview v1 gets **400** with ``{"error": ...}``; a body
  over ``max_body_bytes`` gets **413**. No other 4xx/5xx comes from these endpoints: an
  unexpected error inside the webhook is logged with its traceback and answered as a
  denial for GPU pods and fairgate's ConfigMaps (an allow for anything else), never as
  a 500.
- Every answer is given within ``deadline_seconds`` (default 1 s, well under the API
  server's ``timeoutSeconds``): when the decision (Redis included) is not done by then,
  the ``onRedisUnavailable`` policy answers instead, at once; the late decision runs
  to its end (bounded by the Redis socket timeouts) and records nothing.
- ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 when Redis
  answers and a config is loaded, else 503; the JSON body says which part is missing in
  general terms (anyone who reaches the port may ask): no tenant, quota or error text.
- ``GET /metrics``: Prometheus text (see :mod:`webhook.metrics`).

Why everything on the event loop: a decision is tens of microseconds of pure Python
(parse, plan, patch) around one awaited Redis script (``redis.asyncio`` with the
hiredis parser, :class:`fairshare.queue.fastpath.AsyncFairQueue`). A hop to a worker thread
per request cost more than the decision itself (the hop, then the GIL hand-offs
between the loop and up to 64 threads); see ``BENCHMARKS.md``. Audit records are
written by one background thread (:mod:`webhook.auditing`). Redis sockets time out
quickly (see :func:`fairshare.connection.connect_redis_async`) and the deadline cancels a
decision still waiting for Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from admission.reviews import AdmissionReviewResponse, InvalidReview
from webhook.metrics import CONTENT_TYPE
from webhook.service import AdmissionService, Progress, Webhook

log = logging.getLogger("fairgate.webhook")

DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
DEFAULT_DEADLINE_SECONDS = 1.0


class _BodyError(Exception):
    """A request body refused before parsing (size, framing)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise _BodyError(400, f"invalid Content-Length header {declared[:32]!r}")
        if int(declared) > limit:
            raise _BodyError(
                413, f"request body of {declared} bytes is over the {limit}-byte limit"
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyError(413, f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _review_response(review: AdmissionReviewResponse) -> Response:
    return Response(
        review.model_dump_json(by_alias=True, exclude_none=True),
        media_type="application/json",
    )


def _error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(
    service: AdmissionService,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
) -> FastAPI:
    """The FastAPI app serving ``service`` (see the module docstring for the contract).

    ``service`` decides; this layer does HTTP, limits, the deadline and the latency
    metric (into ``service.metrics``). The service's background parts (the audit writer,
    and with a gang source the sizing of gangs queued before their size was known) run
    for the app's lifespan.
    """
    if max_body_bytes <= 0 or deadline_seconds <= 0:
        raise ValueError("max_body_bytes and deadline_seconds must be positive")
    webhook_metrics = service.metrics
    lingering: set[asyncio.Future[AdmissionReviewResponse]] = set()  # overdue, still running

    def _forget(decision: asyncio.Future[AdmissionReviewResponse]) -> None:
        lingering.discard(decision)
        if not decision.cancelled():
            decision.exception()  # retrieved: its fallback answer was already given

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        service.start()
        sizer = asyncio.create_task(service.size_gangs_forever()) if service.gangs else None
        try:
            yield
        finally:
            if sizer is not None:
                sizer.cancel()
            await asyncio.get_running_loop().run_in_executor(None, service.stop)

    app = FastAPI(
        title="fairgate webhook",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        # fairgate reports through Prometheus (/metrics) and its logs; FastAPI's own
        # OpenTelemetry hooks would look up the global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )

    async def review(request: Request, webhook: Webhook) -> Response:
        started = time.perf_counter()
        operation = "invalid"
        try:
            body = await _read_body(request, max_body_bytes)
            progress = Progress(started=started)
            decision = asyncio.ensure_future(service.review(webhook, body, progress))
            done, _ = await asyncio.wait((decision,), timeout=deadline_seconds)
            if not done:
                # Answer now; the decision finishes on its own, unrecorded (every Redis
                # call has a socket timeout). Not cancelled: cancelling redis-py midway
                # can leak a pooled connection, and cleaning up after a frozen Redis
                # can itself take longer than the deadline.
                lingering.add(decision)
                decision.add_done_callback(_forget)
                answer = service.overdue(webhook, body, progress, deadline_seconds)
            else:
                try:
                    answer = decision.result()
                except InvalidReview:
                    raise
                except Exception as exc:
                    answer = service.failed(webhook, body, progress, exc)
            if progress.review is not None:
                operation = progress.review.request.operation
            return _review_response(answer)
        except _BodyError as exc:
            return _error_response(exc.status, exc.message)
        except InvalidReview as exc:
            return _error_response(400, str(exc))
        except Exception:
            log.exception("unexpected error answering /%s", webhook)
            webhook_metrics.errors.inc()
            return _error_response(400, "fairgate could not read this request")
        finally:
            webhook_metrics.duration.labels(webhook, operation).observe(
                time.perf_counter() - started
            )

    async def mutate(request: Request) -> Response:
        """Mutating admission: stamp, reserve or queue GPU pods."""
        return await review(request, "mutate")

    async def validate(request: Request) -> Response:
        """Validating admission: pod rules and quota ConfigMap edits."""
        return await review(request, "validate")

    # Plain Starlette routes: the body is read and parsed by ``review`` itself, so
    # FastAPI's per-request dependency solving would be pure overhead on the hot path.
    app.add_route("/mutate", mutate, methods=["POST"])
    app.add_route("/validate", validate, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process serves HTTP."""
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: Redis answers and a config is loaded."""
        try:
            async with asyncio.timeout(deadline_seconds):
                ready, detail = await service.readiness()
        except TimeoutError:
            ready, detail = False, {"redis": f"no answer within {deadline_seconds}s"}
        return JSONResponse({"ready": ready, **detail}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        """Prometheus metrics."""
        return Response(webhook_metrics.render(), media_type=CONTENT_TYPE)

    return app


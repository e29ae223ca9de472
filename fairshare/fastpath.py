"""The webhook's side of the fair queue, on ``redis.asyncio``.

Contract: :class:`AsyncFairQueue` offers the calls admission makes (``admit``,
``sync_config``, ``tenant_status``) with exactly the meaning, scripts and errors of
the same methods of :class:`fairshare.queue.FairQueue` (see there), awaited on the
event loop instead of blocking a thread. Any number of them and of ``FairQueue``s may
share one Redis. Cancelling a call (a deadline) may leave its script applied; an
unconfirmed reservation expires like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio

from fairshare.calls import (
    admission,
    admit_args,
    queue_error,
    script_source,
    sync_args,
    tenant_statuses,
)
from fairshare.model import Admission, PodRequest, TenantStatus
from tenants.models import FairgateConfig


class AsyncFairQueue:
    """Admission's calls to the fair queue in Redis ``client`` (keys under ``prefix``)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str = "fairgate:",
        wait_for_rebuild: bool = False,
    ) -> None:
        self._keys = [prefix]
        self.wait_for_rebuild = wait_for_rebuild
        self._scripts = {
            name: client.register_script(script_source(name))
            for name in ("sync", "admit", "status")
        }

    async def _run(self, name: str, *args: str | int | float) -> Any:
        try:
            return await self._scripts[name](keys=self._keys, args=list(args))
        except redis.ResponseError as exc:
            raise (queue_error(exc) or exc) from exc

    async def sync_config(
        self, config: FairgateConfig, capacity: Mapping[str, int] | None
    ) -> None:
        """As :meth:`fairshare.queue.FairQueue.sync_config`."""
        await self._run("sync", *sync_args(config, capacity))

    async def admit(self, req: PodRequest, now: float, dry_run: bool = False) -> Admission:
        """As :meth:`fairshare.queue.FairQueue.admit`."""
        raw = await self._run(
            "admit", *admit_args(req, now, dry_run, self.wait_for_rebuild)
        )
        return admission(raw, req)

    async def tenant_status(self) -> list[TenantStatus]:
        """As :meth:`fairshare.queue.FairQueue.tenant_status`."""
        return tenant_statuses(await self._run("status"))

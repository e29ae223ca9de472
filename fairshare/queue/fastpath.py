"""The webhook's side of the fair queue, on ``redis.asyncio``.

Contract: :class:`AsyncFairQueue` offers the calls admission makes (``admit``,
``sync_config``, ``tenant_status``) with exactly the meaning, scripts and errors of
the same methods of :class:`fairshare.queue.fairqueue.FairQueue` (see there), awaited on the
event loop instead of blocking a thread. Any number of them and of ``FairQueue``s may
share one Redis. Cancelling a call (a deadline) may leave its script applied; an
unconfirmed reservation expires like any other.

Acknowledged means replicated: with ``replicas=n`` (a Sentinel target), :meth:`admit`
runs the script and then ``WAIT n <timeout>`` on the same connection (WAIT counts the
writes of its own connection); fewer than ``n`` replicas holding the write within
``replica_timeout`` raises :class:`NotReplicatedError`, as does a primary that refuses
writes for lack of replicas (``NOREPLICAS``, ``min-replicas-to-write``). The write may
then still be on the primary: unconfirmed, it expires like any other reservation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio

from fairshare.queue.budget import BudgetStatus, read_budgets
from fairshare.queue.calls import (
    admission,
    admit_args,
    bind_args,
    claimed,
    note_priced_args,
    priced_tickets,
    queue_error,
    resize_args,
    sync_args,
    tenant_statuses,
    text,
)
from fairshare.queue.functions import AsyncQueueFunctions
from fairshare.queue.model import Admission, PodRequest, PricedTicket, TenantStatus
from tenants.models import FairgateConfig
from tenants.resources import ResourceCounts

# How long WAIT may block by default: under the webhook's 0.5 s Redis socket timeout, with
# room for the script; a replica on the same network acknowledges in well under 1 ms.
REPLICA_ACK_TIMEOUT = 0.4


class NotReplicatedError(redis.RedisError):
    """An admission's write did not reach enough replicas in time (or the primary refused
    it for lack of replicas): it may be lost in a failover, so it is not acknowledged."""


class AsyncFairQueue:
    """Admission's calls to the fair queue in Redis ``client`` (keys under ``prefix``)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str = "fairgate:",
        wait_for_rebuild: bool = False,
        *,
        replicas: int = 0,
        replica_timeout: float = REPLICA_ACK_TIMEOUT,
    ) -> None:
        """``replicas``: how many replicas must hold an admission before it is answered
        (0: none, for a standalone Redis); ``replica_timeout``: how long ``WAIT`` may
        block for them, in seconds."""
        if replicas < 0 or replica_timeout <= 0:
            raise ValueError(f"replicas must be >= 0 and replica_timeout > 0, got "
                             f"{replicas} and {replica_timeout}")
        self._client = client
        self._budget_key = prefix + "budget"
        self.wait_for_rebuild = wait_for_rebuild
        self.replicas = replicas
        self._wait_ms = max(1, round(replica_timeout * 1000))
        self._functions = AsyncQueueFunctions(client, prefix)

    async def _run(self, name: str, *args: str | int | float,
                   client: redis.asyncio.Redis | None = None) -> Any:
        try:
            return await self._functions(name, *args, client=client)
        except redis.ResponseError as exc:
            if str(exc).startswith("NOREPLICAS"):
                raise NotReplicatedError(f"the primary refuses writes: {exc}") from exc
            raise (queue_error(exc) or exc) from exc

    async def _replicated(self, name: str, *args: str | int | float) -> Any:
        """Run script ``name``, then ``WAIT`` for :attr:`replicas` on its connection."""
        async with self._client.client() as connection:  # one connection for both
            raw = await self._run(name, *args, client=connection)
            acknowledged = int(await connection.wait(self.replicas, self._wait_ms))
        if acknowledged < self.replicas:
            raise NotReplicatedError(
                f"{acknowledged} of {self.replicas} replicas acknowledged within "
                f"{self._wait_ms} ms")
        return raw

    async def sync_config(
        self, config: FairgateConfig, capacity: Mapping[str, int] | None
    ) -> None:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.sync_config`."""
        await self._run("sync", *sync_args(config, capacity))

    async def admit(self, req: PodRequest, now: float, dry_run: bool = False,
                    presented: bool = False) -> Admission:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.admit`; with :attr:`replicas`, answered
        only once that many replicas hold the write (see the module contract)."""
        args = admit_args(req, now, dry_run, self.wait_for_rebuild, presented)
        if self.replicas and not dry_run:
            raw = await self._replicated("admit", *args)
        else:
            raw = await self._run("admit", *args)
        return admission(raw, req)

    async def bind(self, ticket: str, uid: str, namespace: str, name: str,
                   dry_run: bool = False) -> bool:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.bind`."""
        return claimed(await self._run("bind", *bind_args(ticket, uid, namespace, name,
                                                          dry_run)), ticket)

    async def note_priced(self, ticket: str, priced: Mapping[str, ResourceCounts]) -> int:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.note_priced` (one call)."""
        return int(await self._run("note_priced", *note_priced_args(ticket, priced)))

    async def priced_for(self, key: str) -> list[PricedTicket]:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.priced_for` (one call)."""
        return priced_tickets(await self._run("priced_for", key))

    async def budgets(self) -> dict[str, BudgetStatus]:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.budgets` (one HGETALL)."""
        return read_budgets(await self._client.hgetall(self._budget_key))

    async def tenant_status(self) -> list[TenantStatus]:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.tenant_status`."""
        return tenant_statuses(await self._run("status"))

    async def unsized(self) -> list[str]:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.unsized`."""
        return [text(gid) for gid in await self._run("unsized")]

    async def resize(self, sizes: Mapping[str, int]) -> int:
        """As :meth:`fairshare.queue.fairqueue.FairQueue.resize`."""
        if not sizes:
            return 0
        return int(await self._run("resize", *resize_args(sizes)))

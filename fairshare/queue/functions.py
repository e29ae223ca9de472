"""Calling the fair queue's operations: ``FCALL`` of its Redis Function library.

Contract (shared by :class:`fairshare.queue.fairqueue.FairQueue`, synchronous, and the webhook's
:class:`fairshare.queue.fastpath.AsyncFairQueue`):

- :class:`QueueFunctions` / :class:`AsyncQueueFunctions` call an operation of
  :func:`fairshare.queue.calls.library` with the key prefix as its one key: ``FCALL``, or
  ``FCALL_RO`` for the read-only ones. No call is made to check or load the library
  beforehand: when Redis answers that the function does not exist (this version's
  first call, a Redis restarted without persistence, ``FUNCTION FLUSH``; functions
  replicate, so a promoted replica has them unless it was promoted before it got
  them), the library is loaded (``FUNCTION LOAD REPLACE``) and the call is made once
  more, as redis-py does for a script on ``NOSCRIPT``. A call that failed that way
  changed nothing, so calling again is safe. In :class:`AsyncQueueFunctions`, the
  calls that find it missing together share one load.
- Loading never deletes a library: other fairgate versions' libraries (another name)
  stay, so two versions running during a rolling upgrade never unload each other.
- A Redis user that may not load it gets :class:`LibraryLoadError` saying which ACL
  permissions fairgate needs; a Redis without Functions (before 7.0) gets it too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio

from fairshare.queue.calls import READ_ONLY, Library, library

ACL_NEEDED = "+fcall +fcall_ro +function|load"


class LibraryLoadError(redis.ResponseError):
    """Redis refused to load fairgate's function library (permissions, or no Functions)."""


def is_missing(error: redis.ResponseError) -> bool:
    """Whether ``error`` says the called function does not exist (also as an error
    inside a pipeline's reply)."""
    return "Function not found" in str(error)


def _load_error(error: redis.ResponseError, lib: Library) -> LibraryLoadError | None:
    """``error`` of ``FUNCTION LOAD`` as :class:`LibraryLoadError` when it is about
    fairgate's setup (permissions, an old Redis); None for the others (``NOREPLICAS``,
    ``READONLY``, out of memory): raised as they are, for the caller to handle as it
    handles any write."""
    text = str(error)
    if "unknown command" in text.lower():
        why = "this Redis has no Functions: fairgate needs Redis 7.0 or newer"
    elif isinstance(error, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        why = (f"the Redis user may not load or call them: grant it {ACL_NEEDED} "
               f"(ACL SETUSER <user> {ACL_NEEDED}), or give fairgate a user that has them")
    else:
        return None
    return LibraryLoadError(
        f"cannot load fairgate's Redis function library {lib.name} ({text}): {why}")


def _arguments(
    lib: Library, op: str, prefix: str, args: tuple[str | int | float, ...]
) -> list[Any]:
    """``FCALL`` (``FCALL_RO`` for a read-only operation) of ``op`` in ``lib``."""
    return ["FCALL_RO" if op in READ_ONLY else "FCALL", lib.function(op), 1, prefix, *args]


class QueueFunctions:
    """The queue's operations on ``client`` with keys under ``prefix``, in ``lib``
    (default: :func:`fairshare.queue.calls.library`, this fairgate's)."""

    def __init__(self, client: redis.Redis, prefix: str, lib: Library | None = None) -> None:
        self._client = client
        self._prefix = prefix
        self._library = lib or library()

    def load(self) -> None:
        """Load (or load again) the library; :class:`LibraryLoadError` if refused."""
        try:
            self._client.execute_command(  # type: ignore[no-untyped-call]
                "FUNCTION", "LOAD", "REPLACE", self._library.source)
        except redis.ResponseError as error:
            raise (_load_error(error, self._library) or error) from error

    def __call__(self, op: str, *args: str | int | float) -> Any:
        """The reply of operation ``op`` with ARGV ``args`` (its errors raised)."""
        command = _arguments(self._library, op, self._prefix, args)
        try:
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        except redis.ResponseError as error:
            if not is_missing(error):
                raise
        self.load()
        return self._client.execute_command(*command)  # type: ignore[no-untyped-call]

    def pipelined(
        self, calls: list[tuple[str, tuple[str | int | float, ...]]], transaction: bool
    ) -> list[Any]:
        """The replies of ``calls`` (operation, ARGV) sent as one pipeline (a MULTI/EXEC
        with ``transaction``); run once more after loading the library when a function
        was missing (only read-only operations: running the others twice is not safe)."""
        if any(op not in READ_ONLY for op, _ in calls):
            raise ValueError("only read-only operations may be pipelined")

        def execute() -> list[Any]:
            with self._client.pipeline(transaction=transaction) as pipe:
                for op, args in calls:
                    command = _arguments(self._library, op, self._prefix, args)
                    pipe.execute_command(*command)  # type: ignore[no-untyped-call]
                return pipe.execute()

        try:
            return execute()
        except redis.ResponseError as error:
            if not is_missing(error):
                raise
        self.load()
        return execute()


class AsyncQueueFunctions:
    """As :class:`QueueFunctions`, on ``redis.asyncio``; calls that find the library
    missing while a load is under way wait for that load instead of loading it again
    (after a Redis restart, every decision in flight finds it missing, and each load
    holds Redis for milliseconds)."""

    def __init__(
        self, client: redis.asyncio.Redis, prefix: str, lib: Library | None = None
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._library = lib or library()
        self._loading: asyncio.Future[None] | None = None

    async def _load(self) -> None:
        try:
            await self._client.execute_command(  # type: ignore[no-untyped-call]
                "FUNCTION", "LOAD", "REPLACE", self._library.source)
        except redis.ResponseError as error:
            raise (_load_error(error, self._library) or error) from error

    async def load(self) -> None:
        """As :meth:`QueueFunctions.load`, or wait for the load under way."""
        if self._loading is None or self._loading.done():
            self._loading = asyncio.ensure_future(self._load())
        # a caller cancelled (its deadline) does not cancel the load the others wait for
        await asyncio.shield(self._loading)

    async def __call__(self, op: str, *args: str | int | float,
                       client: redis.asyncio.Redis | None = None) -> Any:
        """As :meth:`QueueFunctions.__call__`; on ``client`` (e.g. one connection, for a
        ``WAIT`` after it) if given."""
        target = client or self._client
        command = _arguments(self._library, op, self._prefix, args)
        try:
            return await target.execute_command(*command)  # type: ignore[no-untyped-call]
        except redis.ResponseError as error:
            if not is_missing(error):
                raise
        await self.load()
        return await target.execute_command(*command)  # type: ignore[no-untyped-call]

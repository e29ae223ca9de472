"""fairgate's ConfigMap checks in a worker process, under a time budget.

Why: a tenant admin controls the YAML of its quota ConfigMap, and parsing YAML is CPU
work (a hostile 64 KiB document costs a few hundred ms even with libyaml). Done on the
event loop it delays every pod admission behind it; done in a thread it still holds the
GIL. So :func:`tenants.configmaps.review_configmap` runs in one child process.

Contract:
- :class:`ConfigMapChecker` keeps one child (``python -P -m webhook.checker``, see
  :func:`webhook.child.module_command`; niced by
  :data:`NICENESS` so that it yields the CPU to the webhook), started by :meth:`start`,
  which waits for it (the webhook's start-up), and killed by :meth:`stop` (it ignores
  SIGINT: a Ctrl-C of ``fairgate serve`` stops it through the webhook). Checks run one
  at a time, in order. A check that finds no child starts one; the wait (about a second
  of imports) counts against its budget, so it is refused unless the child is quick.
- :meth:`ConfigMapChecker.review` returns the verdict within ``budget_seconds`` of the
  call, time queued behind other checks included, or raises :class:`CheckOverBudget`
  (never answers late). The child stops a check at the budget itself (``SIGALRM``); a
  child that has not answered ``margin_seconds`` later is killed and replaced.
- A child that dies or breaks the protocol raises :class:`CheckerError` for the check
  in progress; the next check starts a new child.
- Frames on the child's stdin/stdout: a 4-byte big-endian length, then a pickle. The
  child is this package run by this interpreter: both ends are fairgate's own code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import IO, Any

from tenants.configmaps import ConfigMapVerdict, review_configmap
from webhook.child import module_command

log = logging.getLogger("fairgate.webhook")

DEFAULT_BUDGET_SECONDS = 0.5
DEFAULT_MARGIN_SECONDS = 0.2
NICENESS = 10
READY = b"ready"
_LENGTH = struct.Struct(">I")


class CheckOverBudget(Exception):
    """A check did not finish within its time budget; it was abandoned."""


class CheckerError(RuntimeError):
    """The worker process died or answered something unreadable."""


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    """Write one length-prefixed frame and flush."""
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes:
    """Read one length-prefixed frame; EOFError when the stream ends first."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("worker stream closed")
    (length,) = _LENGTH.unpack(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise EOFError("worker stream closed mid-frame")
    return payload


class ConfigMapChecker:
    """:func:`~tenants.configmaps.review_configmap` in a worker process (module doc)."""

    def __init__(self, budget_seconds: float = DEFAULT_BUDGET_SECONDS,
                 margin_seconds: float = DEFAULT_MARGIN_SECONDS) -> None:
        """Checks get ``budget_seconds`` each; a child silent for ``margin_seconds`` past
        a check's budget is killed."""
        if budget_seconds <= 0 or margin_seconds <= 0:
            raise ValueError("budget_seconds and margin_seconds must be positive")
        self.budget_seconds = budget_seconds
        self.margin_seconds = margin_seconds
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fairgate-configmap-check")
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._checking_deadline: float | None = None

    def start(self) -> None:
        """Start the child and wait until it is ready (about a second: its imports).

        A child that cannot start is logged; the next check tries again."""
        try:
            self._executor.submit(self._ready_child).result()
        except CheckerError:
            log.exception("the ConfigMap checker's worker process did not start")

    def stop(self) -> None:
        """Kill the child; checks still queued are abandoned."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._kill()

    async def review(self, **arguments: Any) -> ConfigMapVerdict:
        """``review_configmap(**arguments)`` in the child, within the budget."""
        deadline = time.monotonic() + self.budget_seconds
        work = asyncio.get_running_loop().run_in_executor(
            self._executor, self._check, pickle.dumps(arguments), deadline
        )
        try:
            async with asyncio.timeout(self.budget_seconds + self.margin_seconds):
                reply = await work
        except TimeoutError:
            self._kill_if_stuck()
            raise CheckOverBudget(self._over_budget_message()) from None
        status, value = reply
        if status == "ok":
            verdict: ConfigMapVerdict = value
            return verdict
        if status == "over":
            raise CheckOverBudget(self._over_budget_message())
        raise CheckerError(f"ConfigMap check failed in the worker process:\n{value}")

    def _over_budget_message(self) -> str:
        return f"not checked within fairgate's {self.budget_seconds:g} s budget"

    # -- in the executor thread ------------------------------------------------------

    def _check(self, payload: bytes, deadline: float) -> tuple[str, Any]:
        child = self._ready_child()
        remaining = deadline - time.monotonic()
        if remaining <= 0:  # queued behind other checks, or waited for a new child
            return ("over", None)
        assert child.stdin is not None and child.stdout is not None
        self._checking_deadline = deadline
        try:
            write_frame(child.stdin, pickle.dumps((remaining, payload)))
            reply: tuple[str, Any] = pickle.loads(read_frame(child.stdout))
            return reply
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            self._kill(child)
            raise CheckerError(f"the ConfigMap worker process failed: {exc}") from exc
        finally:
            self._checking_deadline = None

    def _ready_child(self) -> subprocess.Popen[bytes]:
        """The running child, started (and waited for) if there is none."""
        with self._lock:
            child = self._child
            if child is not None and child.poll() is None:
                return child
            child = subprocess.Popen(
                module_command("webhook.checker"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
            self._child = child
        assert child.stdout is not None
        try:
            if read_frame(child.stdout) != READY:
                raise EOFError("no ready frame")
        except (OSError, EOFError) as exc:
            self._kill(child)
            raise CheckerError(f"the ConfigMap worker process did not start: {exc}") from exc
        return child

    # -- from any thread -------------------------------------------------------------

    def _kill_if_stuck(self) -> None:
        """Kill the child when the check it runs is past its deadline and margin (the
        check's deadline counts from its review's call, not from when the child got it)."""
        deadline, child = self._checking_deadline, self._child
        if (deadline is not None and child is not None
                and time.monotonic() >= deadline + self.margin_seconds):
            self._kill(child)

    def _kill(self, child: subprocess.Popen[bytes] | None = None) -> None:
        """Kill ``child`` (default: the current one) and forget it if it is current."""
        with self._lock:
            child = child or self._child
            if child is self._child:
                self._child = None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


# -- the child process --------------------------------------------------------------------


class _Alarm(BaseException):
    """Raised in the child when a check runs past its budget."""


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Alarm


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child's loop: one check per frame until stdin closes."""
    signal.signal(signal.SIGALRM, _alarm)
    write_frame(replies, READY)
    while True:
        try:
            seconds, payload = pickle.loads(read_frame(requests))
        except EOFError:
            return
        reply: tuple[str, Any]
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                reply = ("ok", review_configmap(**pickle.loads(payload)))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Alarm:
            reply = ("over", None)
        except Exception:
            reply = ("error", traceback.format_exc())
        write_frame(replies, pickle.dumps(reply))


def main() -> None:
    """Entry point of ``python -m webhook.checker`` (started by ConfigMapChecker)."""
    os.nice(NICENESS)
    # Ctrl-C reaches the whole process group: the webhook stops this child itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply stream
    _serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()

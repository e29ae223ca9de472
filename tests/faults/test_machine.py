"""The kernel facts the fault tests lean on (:mod:`bench.machine`), on real sockets: a
listener that never accepts (as a stopped or starved Redis) still has its loopback
handshakes completed by the kernel until its accept queue is full; past that the
connect times out and ``ListenDrops`` moves. So a loopback connect that times out while
``ListenDrops`` stays put was late on the connecting side."""

from __future__ import annotations

import socket
from contextlib import ExitStack

from bench.machine import listen_drops

BACKLOG = 1


def test_a_listener_that_never_accepts_completes_handshakes_until_its_queue_drops_one(
) -> None:
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(BACKLOG)
        address = listener.getsockname()
        before = listen_drops()
        connected = 0
        timed_out = False
        while connected < 16 and not timed_out:
            client = stack.enter_context(socket.socket())
            client.settimeout(0.5)
            try:
                client.connect(address)
                connected += 1
            except TimeoutError:
                timed_out = True
        assert connected >= BACKLOG  # handshakes done by the kernel, none accepted
        assert timed_out, "the accept queue never filled"
        assert listen_drops() > before  # the kernel says why this connect timed out


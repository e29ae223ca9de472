"""What the machine did to a measurement, read from Linux ``/proc``: how long a thread
waited for a CPU, and whether the kernel dropped connection attempts at a full listen
queue. Benchmarks and timing tests report these beside their clocks, so that a slow
figure on a shared machine says how much of it was waiting for a CPU."""

from __future__ import annotations

from pathlib import Path

NETSTAT = Path("/proc/net/netstat")


def run_delay_ns(schedstat: str | Path) -> int:
    """Nanoseconds the thread of ``schedstat`` has waited for a CPU while runnable, since
    it started (the second field): ``/proc/<pid>/schedstat`` is a process's main thread,
    ``/proc/self/task/<tid>/schedstat`` one thread of this process."""
    with open(schedstat, encoding="ascii") as stats:
        return int(stats.read().split()[1])


def listen_drops(netstat: Path = NETSTAT) -> int:
    """Connection attempts this network namespace's kernel has dropped at a listening
    socket so far (``TcpExt: ListenDrops``, which counts full accept and SYN queues): on
    loopback the kernel completes a TCP handshake for a live listener, even a stopped
    or starved one, unless it drops the attempt here, so while this count does not move
    a connect to a loopback port that times out was late on the connecting side."""
    lines = netstat.read_text(encoding="ascii").splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenDrops"])
    raise LookupError(f"no TcpExt ListenDrops in {netstat}")

"""Every example of every ``fairgate ... --help`` and of the README runs as written.

The examples are collected from the parsers' epilogs (``examples:``) and from the
README's code blocks (lines starting with ``fairgate``), then run with bash, in
order, in one working directory holding this repository's ``examples/``, against a
stack like the demo's: a real ``redis-server`` and ``fairgate serve`` over HTTPS with
``examples/config``, which has admitted, queued and denied a few pods. A non-zero exit
fails. The only rewriting is of addresses, which are this machine's: the Redis of the
examples (``127.0.0.1:6379``) is the stack's, and their fixed ports are free ones.
``$REDIS_URL`` is set (to the stack's) only for the examples after an ``export
REDIS_URL=...`` line of the same help or of the README, as in the shell of a user who
pasted them in order.
A command that serves (``serve``, ``console``, ``demo --console``, ``audit tail``
following) passes when it is still running after a few seconds and then ends on Ctrl-C
(SIGINT to its process group, as a terminal sends it) with 0 or 130 and no traceback.
Examples that need a cluster (``dispatch``, ``redis-secret``, ``certs ensure``, ``serve``
without ``--config-dir``, ``console --auth kubernetes``) are checked by argument parsing only,
with ``$REDIS_URL`` set as the manifests set it in a cluster.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from webhook_helpers import gpu_pod, review

from fairshare.localredis import free_port, local_redis
from fairshare.queue.fairqueue import FairQueue
from webhook.cli import build_parser
from webhook.process import ServeProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SERVING_SECONDS = 8.0


def _exported(line: str) -> bool:
    return line.startswith("export REDIS_URL=")


def _epilog_examples(parser: argparse.ArgumentParser) -> Iterator[tuple[str, bool]]:
    """The example lines of ``parser``'s epilog and of every subcommand's, in order, each
    with whether an ``export REDIS_URL=...`` line came before it in its epilog."""
    lines = (parser.epilog or "").partition("examples:\n")[2].splitlines()
    joined, exported = "", False
    for line in lines:
        if not line.startswith("  ") or not line.strip():
            continue
        joined += line.strip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        yield joined, exported
        exported = exported or _exported(joined)
        joined = ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _epilog_examples(sub)


def _readme_examples() -> Iterator[tuple[str, bool]]:
    """The README's example commands: lines of its code blocks (fenced or indented)
    that run ``fairgate``, each with whether the README exported REDIS_URL before it."""
    fenced = exported = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            command = line.strip()
            if re.match(r"^((export )?[A-Z_]+=\S+ )*fairgate\b", command):
                yield command, exported
            exported = exported or _exported(command)


def _examples() -> list[tuple[str, bool]]:
    seen: dict[str, tuple[str, bool]] = {}  # without its comment -> as written
    for command, exported in [*_epilog_examples(build_parser()), *_readme_examples()]:
        seen.setdefault(re.sub(r"\s+#.*$", "", command), (command, exported))
    return list(seen.values())


def _words(command: str) -> list[str]:
    """The ``fairgate`` arguments of a command line (assignments, pipes, redirections
    and comments left out)."""
    words = shlex.split(command.partition(" | ")[0], comments=True)
    words = [w for w in words if w != "export"]
    if "fairgate" not in words:  # export REDIS_URL=...
        return []
    start = words.index("fairgate")
    argv = words[start + 1:]
    return argv[:argv.index(">")] if ">" in argv else argv


def _needs_a_cluster(argv: list[str]) -> bool:
    command = argv[0] if argv else ""
    return (command in ("dispatch", "redis-secret")
            or argv[:2] == ["certs", "ensure"]  # writes a Secret through the API server
            or (command == "serve" and "--config-dir" not in argv)
            or (command == "console" and "kubernetes" in argv))


def _serves(argv: list[str]) -> bool:
    return (argv[:1] in (["serve"], ["console"]) or argv[:2] == ["demo", "--console"]
            or (argv[:2] == ["audit", "tail"] and "--no-follow" not in argv))


def test_the_help_and_the_readme_have_the_examples_this_test_runs() -> None:
    examples = [command for command, _exported in _examples()]
    assert len(examples) > 30
    for expected in ("fairgate audit verify", "fairgate simulate examples/weights-1-2-3.yaml",
                     "fairgate report --since 2026-03-01 --until 2026-04-01 --csv > march.csv"):
        assert expected in examples
    assert any(_needs_a_cluster(_words(c)) for c in examples)
    assert any(_serves(_words(c)) for c in examples)


@pytest.fixture(scope="module")
def stack(cert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Redis and ``fairgate serve`` with examples/config; team-a-dev/trainer-0 admitted,
    a team-b pod queued, one in ``sandbox`` denied. Yields the Redis URL."""
    logs = tmp_path_factory.mktemp("examples-stack")
    with local_redis() as url, ServeProcess(cert_dir, url, ROOT / "examples" / "config",
                                            logs / "serve.log") as server:
        client = redis.Redis.from_url(url)
        with server.client() as https:
            for namespace, name, gpus in (("team-a-dev", "trainer-0", "1"),
                                          ("team-b-dev", "b-0", "2"),
                                          ("team-b-dev", "b-1", "1"), ("sandbox", "s-0", "1")):
                ticket = str(uuid.uuid4())
                answer = https.post("/mutate", json=review(gpu_pod(
                    namespace, name, limits={"nvidia.com/gpu": gpus}), uid=ticket))
                if answer.json()["response"]["allowed"]:
                    FairQueue(client).confirm(ticket, str(uuid.uuid4()), namespace, name)
        deadline = time.monotonic() + 10
        while client.xlen("fairgate:audit") < 4:
            assert time.monotonic() < deadline, "the webhook's audit records never arrived"
            time.sleep(0.05)
        client.close()
        yield url


def _local(command: str, redis_url: str) -> str:
    """The command with this machine's addresses: the stack's Redis, free ports."""
    command = command.replace("127.0.0.1:6379", redis_url.split("//")[1].rsplit("/", 1)[0])
    for port in ("8443", "9000", "9090"):
        command = command.replace(f"--port {port}", f"--port {free_port()}")
    if re.search(r"\bfairgate console\b", command) and "--port" not in command:
        command += f" --port {free_port()}"
    return command


def _as_in_a_terminal() -> None:
    """In the example's process: Ctrl-C acts as on a terminal's foreground job, even when
    the tests run where SIGINT is ignored (a background job of a script passes that on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("command", "exported"), _examples(),
                         ids=[command for command, _exported in _examples()])
def test_every_example_runs_as_written(command: str, exported: bool, stack: str,
                                       tmp_path_factory: pytest.TempPathFactory,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _words(command)
    monkeypatch.setenv("REDIS_URL", stack)
    if _needs_a_cluster(argv):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{command!r} does not parse (exit {exc.code})")
        return
    work = tmp_path_factory.getbasetemp() / "examples-work"
    if not work.exists():
        work.mkdir()
        (work / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "REDIS_PASSWORD", "KUBERNETES_SERVICE_HOST")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if exported:
        env["REDIS_URL"] = stack
    script = "set -euo pipefail\n" + _local(command, stack)
    with subprocess.Popen(["bash", "-c", script], cwd=work, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True, preexec_fn=_as_in_a_terminal) as process:
        try:
            out, err = process.communicate(timeout=SERVING_SECONDS if _serves(argv) else 300)
        except subprocess.TimeoutExpired:
            if not _serves(argv):
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"{command!r} did not finish within 300 s")
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it
            out, err = process.communicate(timeout=30)
            assert process.returncode in (0, 130), f"{command!r} after Ctrl-C:\n{err}"
            assert "Traceback" not in err, f"{command!r} while serving or stopping:\n{err}"
            return
    assert process.returncode == 0, f"{command!r} exited {process.returncode}:\n{out}\n{err}"


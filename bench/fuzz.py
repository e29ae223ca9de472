"""Fuzz the webhook and the quota validator with 100,000+ hostile examples.

Run (from the repository root):

    python -m bench.fuzz                    # 100,000 examples in total
    python -m bench.fuzz --examples 10000   # a shorter run
    python -m bench.fuzz --only mutate --log-dir /tmp/fuzz-logs

Runs the hypothesis tests of ``tests/fuzz/`` (the same strategies and oracles as CI)
with ``FAIRGATE_FUZZ_EXAMPLES`` raised, one pytest process per test, and splits the
total between them by ``SHARES``. Each test checks every answer of a real
``fairgate serve`` over HTTPS (or, for the parser, every outcome in-process) and the
server's RSS after every example. Prints a table (examples generated, passing, seconds,
outcome per test) and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.admission import machine

ROOT = Path(__file__).resolve().parent.parent
# test node id -> share of the examples
SHARES = {
    "tests/fuzz/test_webhook_fuzz.py::test_hostile_reviews_get_a_valid_answer[/mutate]": 0.25,
    "tests/fuzz/test_webhook_fuzz.py::test_hostile_reviews_get_a_valid_answer[/validate]": 0.15,
    "tests/fuzz/test_configmap_fuzz.py::test_parse_quota_never_raises_anything_but_a_config_error":
        0.45,
    "tests/fuzz/test_configmap_fuzz.py::test_hostile_quota_edits_get_a_valid_answer": 0.15,
}
_PASSING = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")


def run_test(node: str, examples: int, timeout: float, log: Path) -> dict[str, Any]:
    """One fuzz test with ``examples`` examples; what hypothesis and pytest reported
    (pytest's whole output is written to ``log``)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider",
         "--hypothesis-show-statistics", "-o", f"timeout={int(timeout)}"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout + 60, check=False,
        env={**os.environ, "FAIRGATE_FUZZ_EXAMPLES": str(examples)},
    )
    seconds = time.monotonic() - started
    log.write_text(done.stdout + done.stderr)
    passing = failing = invalid = 0
    for match in _PASSING.finditer(done.stdout):
        passing += int(match.group(1))
        failing += int(match.group(2))
        invalid += int(match.group(3))
    tail = "\n".join(done.stdout.splitlines()[-15:])
    return {"test": node, "asked": examples, "passing": passing, "failing": failing,
            "invalid": invalid, "seconds": round(seconds, 1),
            "outcome": "passed" if done.returncode == 0 else "FAILED", "log": str(log),
            **({} if done.returncode == 0 else {"output_tail": tail})}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.fuzz [--examples N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000,
                        help="examples in total over all tests (100000)")
    parser.add_argument("--timeout", type=float, default=4 * 3600,
                        help="seconds allowed per test (14400)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the tests whose id contains TEXT (repeatable)")
    default_logs = Path(tempfile.gettempdir()) / "fairgate-fuzz-logs"
    parser.add_argument("--log-dir", type=Path, default=default_logs,
                        help=f"where each test's full pytest output goes ({default_logs})")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    chosen = {n: s for n, s in SHARES.items() if not args.only or any(t in n for t in args.only)}
    results = [run_test(node, max(1, round(args.examples * share)), args.timeout,
                        args.log_dir / (re.sub(r"\W+", "_", node.split("::")[1]) + ".log"))
               for node, share in chosen.items()]
    print("| test | examples asked | passing | failing | seconds | outcome |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| `{r['test'].split('::')[1]}` | {r['asked']} | {r['passing']} | "
              f"{r['failing']} | {r['seconds']} | {r['outcome']} |")
    total = sum(r["passing"] for r in results)
    print(f"\ntotal passing examples: {total}")
    print(json.dumps({"machine": machine(), "total_passing": total, "tests": results}))
    return 0 if all(r["outcome"] == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``fairgate demo`` ends with nothing stuck: its default stream holds gangs of four
one-GPU training pods in team-a (nominal 4, borrowLimit 2, inferenceReserve 1), which fit
nominal + borrowLimit as borrowed, and every pod it creates either runs or is refused at
CREATE, end to end through ``fairgate serve`` and the dispatcher on a real Redis.

The README shows what the demo prints; the demo is deterministic (a seeded stream on a
virtual clock), so the README's sample is compared with a run line by line: the table's
header and rows, and the lines that say how the counts add up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import tablefit

from cost.billing import Bill
from cost.report import bill_tables
from webhook.demo import tenant_tables

ROOT = Path(__file__).resolve().parents[2]


def _demo(tmp: Path, columns: int) -> str:
    """What ``fairgate demo`` (no arguments, as the README runs it) prints in a terminal
    ``columns`` wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD")}
    env["TMPDIR"] = str(tmp)
    env["PYTHONPATH"] = str(ROOT)
    env["COLUMNS"] = str(columns)
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "demo"], capture_output=True,
                          text=True, env=env, cwd=tmp, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo's output, unwrapped (the README's lines are not wrapped)."""
    return _demo(tmp_path_factory.mktemp("demo"), 200)


@pytest.mark.parametrize("width", [80, 120])
def test_the_demos_tables_fit_the_terminal(tmp_path: Path, width: int) -> None:
    """In a terminal of 80 columns no header or name of the demo's tables is cut and no
    table line is wider; at 120 no header or row wraps either."""
    printed = _demo(tmp_path, width)
    empty = Bill(datetime.now(UTC), datetime.now(UTC), "USD", [], None, None, None)
    tables = [*tenant_tables({}), *bill_tables(empty)]
    headers = [str(column.header) for table in tables for column in table.columns]
    assert tablefit.problems(printed, width, headers, unwrapped=width >= 120) == []
    names = [line[1:].split("│")[0].strip() for line in printed.splitlines()
             if line.startswith("│ ")]
    assert names.count("(no tenant)") == 2 and names.count("team-a") >= 4, printed


def test_the_demo_ends_with_nothing_waiting(demo_output: str) -> None:
    # the count ends its line ("...; 2 preemptions; still waiting: 0"): exactly zero
    assert re.search(r"; still waiting: 0$", demo_output, re.MULTILINE), demo_output
    assert "never fits" not in demo_output


def _readme_sample() -> list[str]:
    """The README's demo sample: the code block after "shows tables like these"."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index("shows tables like these"):]
    block = after[after.index("```\n") + 4:]
    return block[:block.index("```")].rstrip("\n").splitlines()


def test_the_readmes_demo_sample_is_what_the_demo_prints(demo_output: str) -> None:
    sample = _readme_sample()
    printed = [line.rstrip() for line in demo_output.splitlines()]
    # its structure: the two tables' headers, each followed by one row per tenant, then
    # the summary lines
    headers = [line for line in sample if line.startswith("┃")]
    assert [h.split("┃")[1].strip() for h in headers] == ["tenant", "tenant"]
    assert "admitted" in headers[0] and "training wait" in headers[1]
    rows = [line for line in sample if line.startswith("│ ")]
    summary = [line for line in sample if not line.startswith(("┃", "│"))]
    assert [line.split("│")[1].strip() for line in rows] == [
        "(no tenant)", "team-a", "team-b", "team-c"] * 2
    assert [line.split(" ")[1] for line in summary] == ["pods", "AdmissionReviews", "chain:"]
    assert sample == [headers[0], *rows[:4], headers[1], *rows[4:], *summary]
    # every line as the demo prints it (nothing stuck: "still waiting: 0")
    for line in sample:
        assert line.rstrip() in printed, f"README.md's demo sample line is not printed:\n" \
            f"{line}\nthe demo printed:\n{demo_output}"
    assert summary[1].endswith("still waiting: 0")

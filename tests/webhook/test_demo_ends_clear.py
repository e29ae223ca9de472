"""``fairgate demo`` ends with nothing stuck: its default stream holds gangs of four
one-GPU training pods in team-a (nominal 4, borrowLimit 2, inferenceReserve 1), which fit
nominal + borrowLimit as borrowed, and every pod it creates either runs or is refused at
CREATE, end to end through ``fairgate serve`` and the dispatcher on a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_ends_with_nothing_waiting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD")}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "webhook.cli", "demo"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "still waiting: 0;" in done.stdout, done.stdout
    assert "never fits" not in done.stdout

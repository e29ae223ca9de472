"""admission/ is pure: importing it pulls in no I/O layer of fairgate or its clients."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = (
    "redis",
    "kubernetes",
    "fastapi",
    "uvicorn",
    "httpx",
    "webhook",
    "fairshare",
    "audit",
    "certs",
)
MODULES = (
    "admission.reviews",
    "admission.quantity",
    "admission.pods",
    "admission.demand",
    "admission.classes",
    "admission.plan",
    "admission.mutation",
    "admission.validation",
    "admission.claimguard",
    "admission.sharing",
)


def test_admission_imports_no_io_modules() -> None:
    code = (
        "import sys\n"
        f"for name in {MODULES!r}:\n"
        "    __import__(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""

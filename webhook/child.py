"""How fairgate starts a Python child process of its own.

Contract: :func:`module_command` runs a module with this interpreter and ``-P``, so the
working directory is not on the child's import path: a ``./certs`` (written by
``fairgate certs generate --out ./certs``), ``./audit`` or ``./tenants`` there never
hides fairgate's packages, and the child imports what this interpreter has installed.
"""

from __future__ import annotations

import sys


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` as a child of fairgate's own."""
    return [sys.executable, "-P", "-m", module, *args]

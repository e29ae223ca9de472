"""The Dockerfile: a multi-stage build whose final stage is small and non-root.

No Docker engine runs here, so the image itself is not built. Instead the
tests read the Dockerfile's stages, and build the wheel exactly as the builder
stage does, from the build context `.dockerignore` leaves, then install it in a
fresh virtualenv and run the `fairgate` console script the image runs.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from manifest_objects import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass
class Stage:
    """One FROM ... section of the Dockerfile: its base, alias and instructions."""

    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def commands(self, keyword: str) -> list[str]:
        """The arguments of every instruction ``keyword`` (e.g. RUN) in this stage."""
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages (line continuations joined)."""
    logical = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"cannot parse FROM {rest!r}"
            base = re.sub(r"\$\{(\w+)\}", lambda g: args[g.group(1)], m.group(1))
            stages.append(Stage(base, m.group(2)))
        elif keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


def test_two_stages_on_python_311_slim(stages: list[Stage]) -> None:
    assert [s.base for s in stages] == ["python:3.11-slim", "python:3.11-slim"]
    assert stages[0].alias == "builder"


def test_builder_builds_wheels(stages: list[Stage]) -> None:
    runs = " ".join(stages[0].commands("RUN"))
    assert "pip wheel --wheel-dir /wheels ." in runs


def test_final_stage_is_small_and_non_root(stages: list[Stage]) -> None:
    final = stages[-1]
    assert final.commands("USER") == ["65532:65532"]
    keywords = [kw for kw, _ in final.instructions]
    last_run = len(keywords) - 1 - keywords[::-1].index("RUN")
    assert keywords.index("USER") > last_run  # nothing runs as root after the switch
    # Nothing installs a toolchain, the source
    # tree is never copied in, and packages come only from the builder's wheels.
    assert not final.commands("COPY") and not final.commands("ADD")
    runs = " ".join(final.commands("RUN"))
    for tool in ("apt-get", "apk", "gcc", "build-essential", "make "):
        assert tool not in runs, tool
    assert "--no-index --find-links /wheels" in runs
    assert "from=builder" in runs
    assert "pip uninstall --yes pip setuptools wheel" in runs
    assert final.commands("ENTRYPOINT") == ['["fairgate"]']


def test_user_matches_the_manifests() -> None:
    """The manifests' runAsUser is the image's USER (checked in test_workloads)."""
    assert "runAsUser: 65532" in (REPO / "manifests" / "webhook.yaml").read_text()


# --- the build context and the wheel -------------------------------------


def ignore_patterns() -> list[str]:
    """.dockerignore's patterns; only the subset the matcher below supports."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions (!) are not used in .dockerignore"
        assert "**" not in line.removeprefix("**/"), f"'**' only as a leading '**/': {line}"
        patterns.append(line.rstrip("/"))
    return patterns


def _match(pattern: str, parts: list[str]) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:].split("/")
        return any(_match("/".join(tail), parts[i:]) for i in range(len(parts)))
    pat = pattern.split("/")
    return len(pat) == len(parts) and all(
        fnmatch.fnmatchcase(p, q) for q, p in zip(pat, parts, strict=True)
    )


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: a path is out if it, or a directory above it, matches."""
    parts = rel.split("/")
    return any(_match(p, parts[:n]) for p in patterns for n in range(1, len(parts) + 1))


def test_ignore_matcher() -> None:
    patterns = ["tests", "*.egg-info", "**/__pycache__"]
    assert ignored("tests/a/b.py", patterns)
    assert ignored("x.egg-info/PKG-INFO", patterns)
    assert not ignored("webhook/x.egg-info", patterns)  # anchored at the root
    assert ignored("webhook/sub/__pycache__/m.pyc", patterns)
    assert not ignored("webhook/app.py", patterns)


def build_context(dest: Path) -> None:
    """Copy what `docker build .` would send, honouring .dockerignore."""
    patterns = ignore_patterns()
    for root, dirs, files in os.walk(REPO):
        rel_root = Path(root).relative_to(REPO)
        dirs[:] = [d for d in dirs if not ignored((rel_root / d).as_posix(), patterns)]
        for name in files:
            rel = (rel_root / name).as_posix()
            if not ignored(rel, patterns):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fairgate's wheel, built as the builder stage does, from the docker context."""
    context = tmp_path_factory.mktemp("context")
    build_context(context)
    out = tmp_path_factory.mktemp("wheels")
    # As in the builder: an isolated PEP 517 build (pip fetches the build backend
    # pyproject.toml names), of fairgate's own wheel only.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            str(out),
            str(context),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("fairgate-*.whl")
    return built


def _packages() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return [p.rstrip("*") for p in include]


@pytest.mark.slow
def test_context_leaves_out_tests_and_manifests(tmp_path: Path) -> None:
    build_context(tmp_path)
    assert (tmp_path / "pyproject.toml").is_file()
    for gone in ("tests", "manifests", "charts", "image", "overlays", ".git", "docs"):
        assert not (tmp_path / gone).exists(), gone


@pytest.mark.slow
def test_wheel_holds_every_package_and_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "fairgate = webhook.cli:main" in zf.read(entry_points).decode()
    for package in _packages():
        assert f"{package}/__init__.py" in names, package
    # Lua scripts and YAML data load at run time: they must ship in the wheel.
    data = [
        p.relative_to(REPO).as_posix()
        for package in _packages()
        for pattern in ("*.lua", "*.yaml")
        for p in (REPO / package).rglob(pattern)
    ]
    assert data, "expected Lua scripts in the packages"
    assert not [d for d in data if d not in names]


def running_site_dirs() -> list[str]:
    """The site-packages directories the running interpreter imports from, where the
    wheel's dependencies are: a virtualenv's (plus the base's when it includes them),
    the system's, and the user's (``pip install --user``) when user site is enabled."""
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if Path(d).is_dir()]


def venv_seeing_running_packages(env_dir: Path) -> Path:
    """A fresh virtualenv at ``env_dir`` whose interpreter also imports the running
    interpreter's installed packages (:func:`running_site_dirs`, listed after its own
    site-packages by a ``.pth`` file, so what is installed in the venv wins); its
    python. ``system_site_packages`` would not do: it names the *base* interpreter's,
    which lack the dependencies when the tests run in a virtualenv."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    (Path(own) / "running-interpreter.pth").write_text("\n".join(running_site_dirs()) + "\n")
    return python


def install_in_venv(wheel: Path, home: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """Install the wheel alone into a fresh virtualenv under ``home`` (its dependencies
    are the running interpreter's); the interpreter and the directory the wheel landed in."""
    env_dir = home / "venv"
    python = venv_seeing_running_packages(env_dir)
    pip_install(python, wheel, env)
    return python, env_dir


def install_for_user(wheel: Path, home: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """``pip install --user`` the wheel alone for the base interpreter (the system Python
    when the tests run in a virtualenv; pip refuses ``--user`` inside one), with
    ``PYTHONUSERBASE`` (set in ``env``) under ``home``, so nothing of the machine changes.
    The user site also lists the running interpreter's packages, for the dependencies.
    PEP 668 marks a Debian system Python "externally managed": the user base here is a
    throwaway directory, so the install says it may break it."""
    env["PYTHONUSERBASE"] = str(home / "userbase")
    env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
    python = Path(getattr(sys, "_base_executable", sys.executable))
    pip_install(python, wheel, env, "--user")
    user_site = subprocess.run(
        [str(python), "-c", "import site; print(site.getusersitepackages())"],
        check=True, capture_output=True, text=True, env=env,
    ).stdout.strip()
    (Path(user_site) / "running-interpreter.pth").write_text(
        "\n".join(running_site_dirs()) + "\n"
    )
    return python, home / "userbase"


def pip_install(python: Path, wheel: Path, env: dict[str, str], *options: str) -> None:
    """Install only the wheel, offline, for interpreter ``python``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", *options,
         "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300, env=env,
    )


@pytest.mark.slow
@pytest.mark.parametrize("install", [install_in_venv, install_for_user], ids=["venv", "user"])
def test_installed_wheel_runs_the_console_script(
    wheel: Path, tmp_path: Path, install: Callable[[Path, Path, dict[str, str]], tuple[Path, Path]]
) -> None:
    """What the final stage does (in a virtualenv), and what a user without one does
    (``pip install --user``): install the wheel alone and run `fairgate`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python, prefix = install(wheel, tmp_path, env)
    where = subprocess.run(
        [str(python), "-c", "import webhook; print(webhook.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    assert where.startswith(str(prefix)), where
    help_text = subprocess.run(
        [str(prefix / "bin" / "fairgate"), "--help"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    ).stdout
    for command in ("serve", "dispatch"):
        assert command in help_text

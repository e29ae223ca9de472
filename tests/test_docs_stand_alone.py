"""Every tracked file stands alone: no issue numbers, no paths outside the repository.

The repository is read by people who have only the repository: a reference to an issue
tracker's number, to a document kept elsewhere or to a machine's own directories is a
dead end for them. The contract lives in docs/reference.md.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a file of the project must not say, each with what it looks like.
FORBIDDEN: dict[str, re.Pattern[str]] = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "the design document kept outside the repository": re.compile(r"\bDESIGN\b"),
    "a path outside the repository": re.compile(r"\.\./shared\b|/work/(?:shared|main|wt-)"),
    "the story of its development (a work session)": re.compile(
        r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd"
        r"|th)|earlier|previous|later|next|last|this|that) (?:work )?session\b",
        re.IGNORECASE),
}


def tracked_text_files() -> list[Path]:
    """The files `git ls-files` lists that read as UTF-8 text (this file excepted)."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode().split("\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def offences(text: str) -> list[str]:
    """Each forbidden thing in ``text``, as 'line N: what (the match)'."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(line):
                found.append(f"line {number}: {what} ({match.group(0)!r})")
    return found


def test_the_patterns_catch_what_they_are_for() -> None:
    assert offences("fixed in issue 12, see Issue 11 and issues #7")
    assert offences("the contract: ../shared/DESIGN.md")
    assert offences("see DESIGN invariant 7")
    assert offences("worktree /work/wt-bench")
    assert offences("measured in the seventh session") and offences("the 3rd session's run")
    assert not offences("the design says so; the tissue 3 layer; a pytest session")


def test_no_tracked_file_names_an_issue_or_points_outside_the_repository() -> None:
    files = tracked_text_files()
    assert any(path.name == "README.md" for path in files)
    bad = {
        str(path.relative_to(ROOT)): found
        for path in files
        if (found := offences(path.read_text(encoding="utf-8")))
    }
    assert not bad, bad


def test_benchmarks_is_a_results_page_and_every_cited_section_exists() -> None:
    """BENCHMARKS.md stays a page of today's figures (under 400 lines), and every
    ``BENCHMARKS.md, "<section>"`` a file cites names one of its headings."""
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(page.splitlines()) < 400
    headings = {line.lstrip("#").strip() for line in page.splitlines() if line.startswith("#")}
    cite = re.compile(r"BENCHMARKS\.md`?,?\s+\(?\"([^\"]+)\"", re.MULTILINE)
    cited = {
        (str(path.relative_to(ROOT)), " ".join(name.split()))
        for path in tracked_text_files()
        for name in cite.findall(path.read_text(encoding="utf-8"))
    }
    assert cited, "no citation found: the pattern is stale"
    assert not {(where, name) for where, name in cited if name not in headings}


def _commits_named(text: str) -> list[str]:
    """The words of ``text`` that name a commit of this repository (7 to 40 hex digits
    that ``git`` resolves to a commit)."""
    words = set(re.findall(r"\b[0-9a-f]{7,40}\b", text))
    return sorted(word for word in words if subprocess.run(
        ["git", "cat-file", "-e", f"{word}^{{commit}}"], cwd=ROOT, capture_output=True,
    ).returncode == 0)


def test_operator_pages_speak_to_operators_not_of_how_they_were_made() -> None:
    """README.md and docs/*.md say what fairgate guarantees and how it is tested, not
    what was delivered to whom: no deliverables, no reviewer, no commit hashes (a
    baseline commit in BENCHMARKS.md is a measurement's setup and stays there)."""
    assert _commits_named(subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                                         capture_output=True, text=True).stdout)
    talk = re.compile(r"\b(?:deliverables?|reviewer(?:'s|s)?)\b", re.IGNORECASE)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        found = talk.findall(text) + _commits_named(text)
        if found:
            bad[str(page.relative_to(ROOT))] = found
    assert not bad, bad

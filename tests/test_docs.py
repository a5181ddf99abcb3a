"""README and docs/ describe the present, for users: README fits a front door, and no page but
the results page (which links its earlier runs) carries a lab log: commit hashes, session
numbers, issue numbers, dated entries. Benchmarks cited in the docs exist, benchmarks/README.md
lists every script there is, and a section a page or the code cites by name is on that page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150
# docs/results.md belongs to the results issue: its "earlier runs" name their commits
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
         *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")]

# 7 to 40 hex digits, with at least one digit and one letter: a commit hash, not a number
# (2511), a word (deadline, faced) or an exponent (1e-5)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
SESSION_OR_ISSUE = re.compile(r"\b(?:sessions?|issues?)\s+\d+", re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks (```), where a hex id or a
    date can be an example's data rather than a log entry."""
    lines, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((n, line))
    return lines


def lab_log(text: str) -> list[str]:
    """Every commit hash, "session N", "issue N" and ISO date in the prose, as `line: match`."""
    return [f"{n}: {m.group(0)}" for n, line in prose(text)
            for pattern in (COMMIT, SESSION_OR_ISSUE, DATE) for m in pattern.finditer(line)]


def test_the_lab_log_pattern_finds_hashes_sessions_and_dates_but_not_numbers_or_code():
    text = ("at commit b1ba7ac, then 375bb3c; in session 41 (2026-12-02)\n"
            "12,991 tokens, 2479 in the trie, lr 1e-05, a deadbeef-free faced decade\n"
            "```\ngit worktree add /tmp/base 4e9ee26\n```\n"
            "the process session is killed; the target of issue 20\n")
    assert lab_log(text) == ["1: b1ba7ac", "1: 375bb3c", "1: session 41", "1: 2026-12-02",
                             "6: issue 20"]


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lab_log(page):
    assert lab_log(page.read_text()) == [], f"{page.relative_to(ROOT)}: commit hashes, " \
        "session numbers or dates (git keeps the history)"


def test_cited_benchmarks_exist_and_benchmarks_readme_lists_each_script():
    cited = {name for page in [*PAGES, ROOT / "docs" / "results.md"]
             for name in re.findall(r"benchmarks/([a-z0-9_]+\.py)", page.read_text())}
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert cited <= scripts, f"cited but gone: {sorted(cited - scripts)}"
    listed = set(re.findall(r"`(\w+\.py)`", (ROOT / "benchmarks" / "README.md").read_text()))
    assert listed == scripts


# `docs/page.md, "Section"` or `docs/page.md ("Section")`, the quote possibly wrapped
SECTION_REF = re.compile(r'docs/([a-z_-]+\.md),?\s*\(?"([A-Z`][^"]*)"')
CITING = [*PAGES, ROOT / "docs" / "results.md", ROOT / "results" / "README.md",
          *(p for d in ("offline_agent", "pipelines", "storage", "benchmarks", "tests", "examples")
            for p in sorted((ROOT / d).rglob("*.py")) if p.name != "test_docs.py"),
          *sorted((ROOT / "configs").glob("*.yaml"))]


def section_names(page: str) -> list[str]:
    """A page's headings and bold lead-ins (`**Name.**`), whitespace collapsed: what a
    citation may name."""
    heads = re.findall(r"^#+\s+(.+)$", page, re.MULTILINE)
    bold = re.findall(r"\*\*([^*]+)\*\*", page)
    return [" ".join(s.split()) for s in heads + bold]


def dangling(text: str, sections: dict[str, list[str]]) -> list[str]:
    """Every `docs/page.md, "Section"` whose page (by its `section_names`) lacks a heading or
    bold lead-in starting with that name."""
    return [f"{page}: {name}" for page, raw in SECTION_REF.findall(text)
            for name in [" ".join(raw.split())]
            if not any(s.startswith(name) for s in sections.get(page, []))]


def test_a_section_cited_by_name_that_is_not_there_is_found():
    pages = {"a.md": section_names("# Title\n## The learned critic (stage)\n**Ending targets** (x)\n")}
    text = ('see docs/a.md, "The learned critic", docs/a.md ("Ending\n  targets"),\n'
            'docs/a.md, "Which layer the critic reads", docs/b.md, "Anything"')
    assert dangling(text, pages) == ["a.md: Which layer the critic reads", "b.md: Anything"]


def test_sections_cited_by_name_exist():
    sections = {p.name: section_names(p.read_text()) for p in (ROOT / "docs").glob("*.md")}
    found = [f"{f.relative_to(ROOT)} -> {d}" for f in CITING for d in dangling(f.read_text(), sections)]
    assert found == []

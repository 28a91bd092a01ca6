"""One home for each kind of record (issue 32).

* **Figures** live in the manual's benchmarks page (``docs/benchmarks.md``) only, each section
  of figures naming the commit it was measured at, and each verdict in the page's own words;
  ``bench/README.md`` says how to run each bench and what it asserts: no figure table, no
  commit a figure was taken at.
* **CHANGELOG.md** keeps the form of Keep a Changelog: releases (``## [Unreleased]`` first),
  groups of one kind (``### Added``...), one bullet per change on one line, no measurements,
  no commits (the history of passes stays in git); the manual includes it as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH_README = ROOT / "bench" / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
CHANGELOG = ROOT / "CHANGELOG.md"

# A short commit hash as the record names one: 7 to 12 hex digits, with a digit and a letter.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")
# A measured quantity: a number and the unit of a time or a rate (a size alone is as often a
# parameter, "100 MiB transfers", as a figure: figures of sizes are caught as numeric cells).
MEASURE = r"\d[\d,]*(?:\.\d+)?\s?(?:ms|µs|us|req/s|MiB/s|MB/s)(?![\w/])"
# A goal is a measure behind a comparison ("<= 0.5 ms"), a setting is in backquotes.
GOAL = re.compile(r"(?:<=|>=|<|>|≤|≥)\s*" + MEASURE)
MEASURED = re.compile(MEASURE)
# In the changelog, a share or a ratio is a measurement too ("now 3 %", "7-9x less").
DIARY = re.compile(MEASURE + r"|\d(?:\.\d+)?\s?%|\d(?:\.\d+)?x\b")
# A table cell that is a figure by itself: "1,111", "0.803", "+0.78", "0.38x", "12 %".
NUMERIC_CELL = re.compile(r"^[+-]?\d[\d,]*(?:\.\d+)?\s?(?:x|%|ms|µs|us|MB|MiB)?$")
MAX_BULLET = 300
GROUPS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
RELEASE = re.compile(r"^## \[(?:Unreleased|\d+\.\d+\.\d+)\](?: - \d{4}-\d{2}-\d{2})?$")
VERDICTS = re.compile(r"^(?:PASS|MISS|INCONCLUSIVE)\b")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The lines of a Markdown page outside its code blocks (fenced or indented), numbered."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or (line.startswith("    ") and not line.lstrip().startswith(("*", "-"))):
            continue
        out.append((number, line))
    return out


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _figure_rows(path: Path) -> list[str]:
    """Table rows holding measured figures: two numeric cells, or a measure that is no goal."""
    rows = []
    for number, line in _prose(path):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = _cells(line)
        numeric = sum(1 for cell in cells if NUMERIC_CELL.match(cell.replace("**", "")))
        text = GOAL.sub("", re.sub(r"`[^`]*`", "", line))
        if numeric >= 2 or MEASURED.search(text):
            rows.append(f"{path.name}:{number}: {line}")
    return rows


def test_the_bench_readme_holds_no_figures() -> None:
    """bench/README.md says how to run and what is asserted; the figures are in the manual."""
    rows = _figure_rows(BENCH_README)
    assert not rows, "figures belong in docs/benchmarks.md:\n" + "\n".join(rows)
    commits = [f"{n}: {line}" for n, line in _prose(BENCH_README) if COMMIT.search(line)]
    assert not commits, "a commit a figure was taken at, in bench/README.md:\n" + "\n".join(commits)
    text = BENCH_README.read_text(encoding="utf-8")
    assert "docs/benchmarks.md" in text, "bench/README.md must say where the figures are"


def test_the_figure_check_finds_a_figure_table() -> None:
    """The check above is not empty: the manual's page does hold figure tables."""
    assert len(_figure_rows(BENCHMARKS)) > 20


def _sections(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    title = ""
    for _, line in _prose(path):
        if line.startswith("#"):
            title = line
            out[title] = []
        else:
            out.setdefault(title, []).append(line)
    return out


def test_every_section_of_figures_names_its_commit() -> None:
    """A figure without the commit it was measured at cannot be reproduced nor replaced."""
    nameless = []
    for title, lines in _sections(BENCHMARKS).items():
        text = "\n".join(lines)
        has_figures = any(_figure_rows_in(lines))
        if has_figures and not COMMIT.search(text):
            nameless.append(title)
    assert not nameless, "sections of figures without a commit: " + ", ".join(nameless)


def _figure_rows_in(lines: list[str]) -> list[str]:
    return [
        line
        for line in lines
        if line.startswith("|")
        and sum(1 for c in _cells(line) if NUMERIC_CELL.match(c.replace("**", ""))) >= 2
    ]


def test_every_verdict_is_a_benchs() -> None:
    """In docs/benchmarks.md every verdict is one a bench printed (PASS, MISS, INCONCLUSIVE):
    never a person's reading of the figures ("pass *(by hand)*"), never a bare "pass"."""
    wrong = []
    for number, line in _prose(BENCHMARKS):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        last = _cells(line)[-1].replace("**", "")
        judged = re.match(r"(?i)^(pass|miss|borderline|n/a|inconclusive)\b", last)
        if (judged and not VERDICTS.match(last)) or "by hand" in last:
            wrong.append(f"{number}: {line}")
    assert not wrong, "verdicts no bench printed:\n" + "\n".join(wrong)


def test_the_changelog_keeps_its_form() -> None:
    """Keep a Changelog: releases, groups of one kind, one line per change, no diary."""
    lines = CHANGELOG.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# Changelog"
    releases = [line for line in lines if line.startswith("## ")]
    assert releases and releases[0] == "## [Unreleased]", releases[:1]
    assert all(RELEASE.match(line) for line in releases), releases
    problems = []
    release, group, seen = None, None, set()
    for number, line in enumerate(lines, 1):
        where = f"CHANGELOG.md:{number}: {line[:80]}"
        if line.startswith("## "):
            release, group, seen = line, None, set()
        elif line.startswith("### "):
            group = line[4:]
            if release is None or group not in GROUPS or group in seen:
                problems.append(f"{where} (a group of {sorted(GROUPS)}, once per release)")
            seen.add(group)
        elif line.startswith("#") and number > 1:
            problems.append(f"{where} (no other heading)")
        elif group is not None and line.strip():
            if line.startswith("<!--") and line.endswith("-->"):
                continue
            if not line.startswith("- "):
                problems.append(f"{where} (one bullet per line, no continuation)")
            elif len(line) > MAX_BULLET:
                problems.append(f"{where} ({len(line)} characters > {MAX_BULLET})")
        if release is not None and (DIARY.search(line) or COMMIT.search(line)):
            problems.append(f"{where} (figures and commits belong in docs/benchmarks.md)")
        if line.startswith("|"):
            problems.append(f"{where} (no tables)")
    assert not problems, "\n".join(problems)


def test_the_manual_includes_the_changelog() -> None:
    page = (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    assert '--8<-- "CHANGELOG.md"' in page

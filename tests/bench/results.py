"""Writing a benchmark's results page without losing the runs before it.

A page under docs/benchmarks/ starts with the latest run's report (what the script
generates) and keeps below it, by hand or from earlier runs, the before/after history
and its analysis. A script replaces only the report: the page's text from its first
"## Earlier runs" or "## Before" heading on stays; a page with neither is kept whole
under a new "## Earlier runs" heading.
"""

from __future__ import annotations

from pathlib import Path

KEPT_HEADINGS = ("## Earlier runs", "## Before")


def write_report(path: Path, report: str) -> None:
    old = path.read_text() if path.exists() else ""
    found = [old.index(heading) for heading in KEPT_HEADINGS if heading in old]
    if found:
        kept = old[min(found):]
    elif old.strip():
        lines = old.splitlines()
        body = "\n".join(lines[1:] if lines[0].startswith("# ") else lines).strip()
        kept = f"## Earlier runs (the page as it was before the run above)\n\n{body}\n"
    else:
        kept = ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.rstrip() + "\n\n" + kept if kept else report)

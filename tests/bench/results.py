"""Writing a benchmark's results page without losing the runs before it.

A page under docs/benchmarks/ starts with the latest run's report (what the script
generates) and keeps below it, by hand or from earlier runs, the before/after history
and its analysis. A new report goes on top; the report it replaces (with whatever was
written beside it by hand) is kept under an "## Earlier runs" heading, above the page's
older history (its first "## Earlier runs" or "## Before" heading on).
"""

from __future__ import annotations

from pathlib import Path

KEPT_HEADINGS = ("## Earlier runs", "## Before")


def write_report(path: Path, report: str) -> None:
    old = path.read_text() if path.exists() else ""
    lines = old.splitlines()
    body = "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines).strip()
    found = [body.index(heading) for heading in KEPT_HEADINGS if heading in body]
    previous, history = (body[:min(found)], body[min(found):]) if found else (body, "")
    kept = [f"## Earlier runs: the report before the one above\n\n{previous.strip()}\n"] if previous.strip() else []
    kept += [history.strip() + "\n"] if history.strip() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.rstrip() + "\n\n" + "\n".join(kept) if kept else report)

"""A report page in a real browser: headless chromium, a probe script that marks what
loaded, and a parser of the DOM it dumps (test_report_render.py and the engine tests'
experiment report)."""

from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser

import pytest

# Put before </body>: marks each image's natural width and the page as loaded, for the
# DOM chromium dumps.
PROBE = """<script>
window.addEventListener("load", () => {
  for (const img of document.images) img.dataset.naturalWidth = String(img.naturalWidth);
  document.body.dataset.probe = "loaded";
});
</script>"""


def chromium() -> str:
    """Debian's chromium (scripts/setup.sh installs it).  Missing: a skip on a
    workstation, a failure under CI, where the set-up must have installed it."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail("CI is set but chromium is not installed: scripts/setup.sh installs it")
    pytest.skip("chromium is not installed (as root: apt-get install -y chromium)")


class Dom(HTMLParser):
    """What a report page shows once loaded in the browser (PROBE's marks): each table's
    body rows, each plot's natural width and figure attributes, the summary's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, int] = {}  # id -> body rows
        self.plots: dict[str, int] = {}  # data-plot -> the image's natural width
        self.figures: dict[str, dict[str, str]] = {}  # data-plot -> the figure's attributes
        self.summary = ""
        self._in_summary = False
        self.body: dict[str, str] = {}
        self._table: str | None = None
        self._plot: str | None = None
        self._in_body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        elif tag == "table":
            self._table = a.get("data-table")
            self.tables[self._table or ""] = 0
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table is not None and self._in_body:
            self.tables[self._table] += 1
        elif tag == "figure":
            self._plot = a.get("data-plot")
            self.figures[self._plot or ""] = a
        elif tag == "p" and a.get("id") == "summary-text":
            self._in_summary = True
        elif tag == "img" and self._plot is not None:
            self.plots[self._plot] = int(a.get("data-natural-width") or 0)

    def handle_data(self, data: str) -> None:
        if self._in_summary:
            self.summary += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_summary = False
        if tag == "table":
            self._table, self._in_body = None, False
        elif tag == "figure":
            self._plot = None

"""Issue 32.2: the built site in Chromium from the system packages (Debian's ``chromium``; ``.ci/run``
installs it), headless, as ``chromium --headless --dump-dom`` and ``--screenshot`` give it. Run by
``python3 dev.py docs`` after the build, beside the Qt WebEngine check (``test_site.py``).

The site is served from 127.0.0.1 (a server on a free port, stopped by the fixture). For the index and one
API page (``gae``): the title, the sidebar's links to every guide, every formula typeset by MathJax (its TeX
kept in a ``math/tex`` script, its output beside it, no raw ``\\(`` left in the text), and not one message on
the JavaScript console (Chromium logs each as ``CONSOLE``). Screenshots go to ``docs/_build/screenshots``.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
SHOTS = ROOT / "docs" / "_build" / "screenshots"
GUIDES = sorted(p.stem for p in (ROOT / "docs" / "guides").glob("*.md"))
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run)")
# The flags of a headless run on a machine without a network or a session bus (no background fetches).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000")


class Page(html.parser.HTMLParser):
    """What the rendered DOM holds: its title, the sidebar's links, MathJax's scripts and outputs, and any
    text that still holds a formula's delimiter."""

    def __init__(self) -> None:
        super().__init__()
        self.title, self.links, self.typeset, self.output, self.raw = "", [], 0, 0, 0
        self._stack: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "script" and (attrs.get("type") or "").startswith("math/tex"):
            self.typeset += 1
        if tag == "math" or {"MathJax", "MathJax_Display", "MathJax_MathML"} & set(classes):
            self.output += 1
        if tag == "a" and any("sidebar-tree" in c for _, c in self._stack):
            self.links.append(attrs.get("href") or "")
        if tag not in ("br", "img", "meta", "link", "input", "hr"):
            self._stack.append((tag, " ".join(classes)))

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        inside = [t for t, _ in self._stack]
        if inside and inside[-1] == "title":
            self.title += data
        elif not {"script", "style"} & set(inside) and ("\\(" in data or "\\[" in data):
            self.raw += 1


@pytest.fixture(scope="module")
def served():
    if not (SITE / "index.html").exists():
        pytest.fail("build the site first: python3 dev.py docs")
    SHOTS.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url], capture_output=True,
                          text=True, timeout=120, cwd=profile.parent)


@pytest.mark.parametrize("page", ["index.html", "api/_generated/prm_jax.kernels.gae.html"])
def test_chromium_renders_the_page_with_navigation_typeset_maths_and_a_silent_console(page, served, tmp_path):
    url = f"{served}/{page}"
    dump = chromium(url, tmp_path / "profile", "--dump-dom")
    assert dump.returncode == 0, dump.stderr[-3000:]
    console = [line for line in dump.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    found = Page()
    found.feed(dump.stdout)
    assert "prm-jax" in found.title, found.title
    linked = {Path(link.split("#")[0]).stem for link in found.links if "guides/" in link}
    assert set(GUIDES) <= linked, sorted(set(GUIDES) - linked)
    assert found.typeset > 0 and found.output >= found.typeset and found.raw == 0, vars(found)
    shot = SHOTS / f"chromium-{Path(page).stem}.png"
    taken = chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,900")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-3000:]


@pytest.mark.parametrize("page", ["index.html", "guides/scorers.html",
                                  "api/_generated/prm_jax.kernels.compute_advantages.html"])
def test_screenshots_of_the_landing_page_a_guide_and_compute_advantages_at_1280_px(page, served, tmp_path):
    # Issue 46.3: the screenshots CI keeps (docs/_build/screenshots) of the pages a newcomer meets first, at a
    # laptop's width; the overflow itself is measured in test_site.py.
    shot = SHOTS / f"1280-{Path(page).stem}.png"
    taken = chromium(f"{served}/{page}", tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-3000:]

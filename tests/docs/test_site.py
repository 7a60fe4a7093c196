"""Issue 32.2: the built site renders in a real headless browser. Run by ``python3 dev.py docs`` after the
build (in ``.venv-docs``), not by the main suite.

The browser is Chromium as Qt WebEngine embeds it (``PyQt6-WebEngine`` from PyPI, the docs extra; no system
Chromium is needed), offscreen, in a window of 1,280 x 800 (a laptop's). For the index and one API page
(``gae``): the title, the navigation (the sidebar's links to every guide), a formula rendered by MathJax
(served from ``_static``: no network), and no error on the JavaScript console. Issue 46.3: on the landing
page, a guide and API pages, no code block, table or signature runs past its box or the window; the
landing page's example shows whole without scrolling; the site's search finds ``score_arrays``. Issue 57.10:
titles and names in tables wrap between words or after a name's dots, never inside a word, and the content
column takes the width a laptop's window leaves.
Screenshots go to ``docs/_build/screenshots`` (ignored by git).
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
SHOTS = ROOT / "docs" / "_build" / "screenshots"
GUIDES = sorted(p.stem for p in (ROOT / "docs" / "guides").glob("*.md"))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--no-sandbox --disable-gpu")
qt_core = pytest.importorskip("PyQt6.QtCore", reason="needs the docs extra (PyQt6-WebEngine): python3 dev.py docs")
from PyQt6.QtWebEngineCore import QWebEnginePage  # noqa: E402
from PyQt6.QtWebEngineWidgets import QWebEngineView  # noqa: E402
from PyQt6.QtWidgets import QApplication  # noqa: E402

# What the page reports once MathJax has typeset it (or after 20 s): JSON read back from the page.
PROBE = r"""
(function () {
  // MathJax 2 keeps each formula's TeX in a math/tex script beside its output (HTML-CSS, or MathML where the
  // browser has it); a formula left as raw text still shows its \\( delimiter.
  var typeset = document.querySelectorAll('script[type^="math/tex"]').length;
  var raw = Array.prototype.filter.call(document.querySelectorAll('.math.notranslate'), function (e) {
    return e.innerText.indexOf('\\(') >= 0 || e.innerText.indexOf('\\[') >= 0; }).length;
  var output = document.querySelectorAll('.MathJax, .MathJax_Display, .MathJax_MathML, math').length;
  var links = Array.prototype.map.call(document.querySelectorAll('.sidebar-tree a'), function (a) {
    return a.getAttribute('href'); });
  // Issue 46.3: what runs past its box (scrolls inside it) or past the window, at this width.
  var width = document.documentElement.clientWidth;
  var overflowing = Array.prototype.filter.call(
    document.querySelectorAll('article pre, article table, article dl.py > dt'), function (e) {
      return e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > width + 1; }).map(function (e) {
      return e.tagName + ': ' + e.innerText.slice(0, 80); });
  // Issue 57.10: a title or a name in a table broken inside a word ("compute_advant / ages"): a line that
  // starts with a letter or digit right after a letter or digit of the line before.
  var midword = [];
  Array.prototype.forEach.call(document.querySelectorAll('article h1, article table code'), function (e) {
    var walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT, null);
    var range = document.createRange(), lastTop = null, prev = '';
    while (walker.nextNode()) {
      var node = walker.currentNode;
      for (var i = 0; i < node.nodeValue.length; i++) {
        range.setStart(node, i); range.setEnd(node, i + 1);
        var rects = range.getClientRects(), ch = node.nodeValue[i];
        if (!rects.length) { prev = ch; continue; }  // (a space collapsed at a line's end: a break there is fine)
        var top = rects[0].top;
        if (lastTop !== null && top > lastTop + 2 && /[A-Za-z0-9]/.test(prev) && /[A-Za-z0-9]/.test(ch)) {
          midword.push(e.tagName + ': ' + e.textContent.slice(0, 60) + ' (at ' + prev + '|' + ch + ')');
        }
        lastTop = top; prev = ch;
      }
    }
  });
  var example = document.querySelector('.landing-example');
  var exampleBottom = example ? example.getBoundingClientRect().bottom : null;
  var found = Array.prototype.map.call(document.querySelectorAll('#search-results a, ul.search a'), function (a) {
    return a.getAttribute('href'); });
  return JSON.stringify({title: document.title, typeset: typeset, raw: raw, output: output, links: links,
                         overflowing: overflowing, midword: midword,
                         article: (document.querySelector('article') || {}).clientWidth || 0,
                         sidebar: (document.querySelector('.sidebar-drawer') || {}).clientWidth || 0,
                         toc: (document.querySelector('.toc-drawer') || {}).clientWidth || 0,
                         pageWidth: document.documentElement.scrollWidth, width: width,
                         exampleBottom: exampleBottom, height: window.innerHeight, found: found});
})()
"""


# Polled: 1 once MathJax's start-up (its first typesetting) has ended (hooked the first time MathJax.Hub exists),
# or at once on a page without maths; on the search page, once the results are listed.
WAIT = r"""
(function () {
  if (window.__typeset) { return 1; }
  if (location.pathname.indexOf('search.html') >= 0) {
    return document.querySelectorAll('#search-results a, ul.search a').length > 0 ? 1 : 0; }
  if (!document.querySelector('.math') && document.readyState === 'complete') { return 1; }
  if (window.MathJax && MathJax.Hub && !window.__queued) {
    window.__queued = 1;
    MathJax.Hub.Register.StartupHook("End", function () { window.__typeset = 1; });
  }
  return 0;
})()
"""


class Page(QWebEnginePage):
    def __init__(self, errors):
        super().__init__()
        self.errors = errors

    def javaScriptConsoleMessage(self, level, message, line, source):  # (Qt's name)
        if level == QWebEnginePage.JavaScriptConsoleMessageLevel.ErrorMessageLevel:
            self.errors.append(f"{source}:{line}: {message}")


def render(path: Path, query: str = "") -> tuple[dict, list[str]]:
    """Loads ``path``, waits for MathJax's queue to drain, and returns the probe's answer and the console's
    errors; saves a screenshot."""
    import json

    app = QApplication.instance() or QApplication(sys.argv[:1])
    errors: list[str] = []
    view = QWebEngineView()
    view.setPage(Page(errors))
    view.resize(1280, 800)
    result: dict = {}
    timer = qt_core.QTimer()

    def probe():
        def answer(text):
            result.update(json.loads(text))
            view.grab().save(str(SHOTS / f"qt-{path.stem}.png"))
            app.quit()

        view.page().runJavaScript(PROBE, answer)

    def loaded(ok):
        assert ok, path
        # MathJax 2 (deferred): once it has started, queue a marker behind its typesetting; probe when that ran.
        timer.timeout.connect(lambda: view.page().runJavaScript(WAIT, lambda v: v and (timer.stop(), probe())))
        timer.start(100)

    view.loadFinished.connect(loaded)
    url = qt_core.QUrl.fromLocalFile(str(path))
    if query:
        url.setQuery(query)
    view.load(url)
    qt_core.QTimer.singleShot(30000, app.quit)
    view.show()
    app.exec()
    timer.stop()
    return result, errors


@pytest.fixture(scope="module", autouse=True)
def built_site():
    if not (SITE / "index.html").exists():
        pytest.fail("build the site first: python3 dev.py docs")
    SHOTS.mkdir(parents=True, exist_ok=True)


def render_in_a_process(page: str, query: str = "") -> tuple[dict, list[str]]:
    """``render`` in a fresh process: Qt WebEngine keeps one application per process (a second page in the
    same process crashed it)."""
    import json
    import subprocess

    proc = subprocess.run([sys.executable, __file__, page, query], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer["result"], answer["errors"]


@pytest.mark.parametrize("page", ["index.html", "api/_generated/prm_jax.kernels.gae.html"])
def test_the_page_renders_with_navigation_a_typeset_formula_and_no_console_error(page):
    result, errors = render_in_a_process(page)
    assert result, f"{page} did not answer within 30 s"
    assert "prm-jax" in result["title"], result["title"]
    linked = {Path(link.split("#")[0]).stem for link in result["links"] if link and "guides/" in link}
    assert set(GUIDES) <= linked, sorted(set(GUIDES) - linked)
    # MathJax turned every formula's TeX into rendered maths
    assert result["typeset"] > 0 and result["output"] >= result["typeset"] and result["raw"] == 0, result
    assert errors == []


PAGES = ["index.html", "getting-started.html", "guides/scorers.html", "guides/credit-assignment.html",
         "guides/command-line.html", "api/_generated/prm_jax.kernels.compute_advantages.html",
         "api/_generated/prm_jax.scorers.OpenAIJudgeScorer.html", "api/_generated/prm_jax.config.AdvantageConfig.html"]


@pytest.mark.parametrize("page", PAGES)
def test_nothing_runs_past_its_box_or_the_window_at_1280_px(page):
    # Issue 46.3: alabaster's fixed 940 px column cut off code and let tables spill.
    result, errors = render_in_a_process(page)
    assert result, f"{page} did not answer within 30 s"
    assert result["overflowing"] == [], result["overflowing"]
    assert result["pageWidth"] <= result["width"], (result["pageWidth"], result["width"])
    assert errors == []


@pytest.mark.parametrize("page", [*PAGES, "guides/public-api.html",
                                  "api/_generated/prm_jax.scorers.TeacherLogprobScorer.html"])
def test_titles_and_names_in_tables_wrap_only_between_words_or_after_dots_at_1280_px(page):
    # Issue 57.10: at 1,280 px titles broke mid-word ("compute_advant / ages") and table cells split names
    # (`TeacherLogprobSco / rer`): they wrap at spaces, or after a name's dots and underscores.
    result, errors = render_in_a_process(page)
    assert result, f"{page} did not answer within 30 s"
    assert result["midword"] == [], result["midword"]
    assert errors == []


def test_the_content_column_takes_the_width_a_laptop_leaves():
    # Issue 57.10: furo's content column is 46em (736 px) whatever the window; at 1,280 px it now takes the width
    # the sidebars leave (up to 64em), and nothing runs past the window for it (the test above).
    result, errors = render_in_a_process("guides/scorers.html")
    assert result["article"] >= 800, (result["article"], result["sidebar"], result["toc"], result["width"])
    assert result["pageWidth"] <= result["width"] and errors == []


def test_the_landing_pages_example_shows_without_scrolling():
    result, _ = render_in_a_process("index.html")
    assert result["exampleBottom"] is not None and result["exampleBottom"] <= result["height"], result


def test_the_search_finds_score_arrays():
    result, errors = render_in_a_process("search.html", "q=score_arrays")
    assert any("score_arrays" in (link or "") for link in result["found"]), result["found"]
    assert errors == []


if __name__ == "__main__":  # one page, rendered in this process (render_in_a_process)
    import json

    SHOTS.mkdir(parents=True, exist_ok=True)
    found, console = render(SITE / sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
    print(json.dumps({"result": found, "errors": console}))

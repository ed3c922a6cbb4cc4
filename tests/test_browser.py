"""The rendered book in a real browser (Debian's headless Chromium, driven by Playwright):
every page loads without console errors, the framework tabs switch, figures and plots are
present, and no internal link or anchor is broken."""
import functools
import http.server
import os
import re
import shutil
import threading
from urllib.parse import unquote, urljoin, urlparse

import pytest

from test_book import toc_files

pytestmark = pytest.mark.browser   # the built book in headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if CHROMIUM is None:
    if os.environ.get("CI"):
        pytest.fail("Chromium is missing in CI: `make test` installs Debian's chromium as root",
                    pytrace=False)
    pytest.skip("no Chromium on this machine (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def site(built_book):
    html, _ = built_book
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def watch(page, problems):
    """Record the page's console errors, page errors and failed requests in ``problems``;
    return the set of its requests in flight, which :func:`visit` waits to empty."""
    in_flight = set()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: in_flight.add(r))
    page.on("requestfinished", lambda r: in_flight.discard(r))

    def failed(r):
        in_flight.discard(r)
        problems.append(f"request failed: {r.url}")
    page.on("requestfailed", failed)
    return in_flight


QUIET_S, POLL_MS, SETTLE_LIMIT_S = 0.15, 50, 30


def visit(page, url, in_flight):
    """Go to ``url``: its load event, then until no request of the page has been in flight for
    QUIET_S (Playwright's "networkidle" waits 0.5 s of quiet on every page, half the time of
    a visit here); the requests started in the meantime (scripts, fonts, MathJax) are
    waited for."""
    page.goto(url, wait_until="load")
    quiet, waited = 0.0, 0.0
    while quiet < QUIET_S:
        page.wait_for_timeout(POLL_MS)          # Playwright delivers the page's events here
        waited += POLL_MS / 1000
        quiet = 0.0 if in_flight else quiet + POLL_MS / 1000
        if waited > SETTLE_LIMIT_S:
            raise AssertionError(f"{url}: requests still in flight after {SETTLE_LIMIT_S} s: "
                                 + ", ".join(sorted(r.url for r in in_flight)))


PAGES = [f"{f}.html" for f in toc_files()]


# What a test needs from every page, gathered in one visit of each page per window width
# (a visit per test and page cost minutes): evaluated in the page after it loaded.
PAGE_FACTS = """() => {
    const main = document.querySelector('article.bd-article');
    const text = main ? main.cloneNode(true) : document.createElement('div');
    text.querySelectorAll('.cell_input, div[class^="highlight-"]:not(.output)')
        .forEach(e => e.remove());
    return {
        title: document.title,
        broken_images: [...document.images].filter(e => !(e.complete && e.naturalWidth > 0))
            .map(e => e.src),
        hrefs: [...document.querySelectorAll('a[href]')].map(e => e.getAttribute('href')),
        plots: document.querySelectorAll('.cell_output img').length,
        text: text.innerText,
        tables: document.querySelectorAll('.cell_output table').length,
        wide: main ? [...main.querySelectorAll('table')]
            .filter(t => t.offsetParent !== null && t.closest('.sd-tab-content, details:not([open]), .full-width') === null
                    && t.getBoundingClientRect().width > main.getBoundingClientRect().width + 1)
            .map(t => `${Math.round(t.getBoundingClientRect().width)}px > `
                      + `${Math.round(main.getBoundingClientRect().width)}px: `
                      + (t.querySelector('tr') || t).innerText.replace(/\s+/g, ' ').slice(0, 70)) : [],
        cut: [...document.querySelectorAll('article pre')]
            .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
            .map(e => e.textContent.split('\\n')
                 .reduce((a, b) => a.length >= b.length ? a : b).slice(0, 70)),
    };
}"""


@pytest.fixture(scope="module")
def seen(site, browser):
    """``seen(width)``: {path: facts} for every page of the book at that window width (each
    page loaded once, by :func:`visit`; console errors, page errors and failed requests in
    ``facts['problems']``)."""
    html, base = site
    cache = {}

    def at(width):
        if width not in cache:
            cache[width] = {}
            page = browser.new_page(viewport={"width": width, "height": 900})
            problems = []
            in_flight = watch(page, problems)
            for path in PAGES:
                problems.clear()
                visit(page, base + path, in_flight)
                cache[width][path] = dict(page.evaluate(PAGE_FACTS), problems=list(problems))
                page.goto("about:blank")   # leaving a page cancels its late requests (favicon)
            page.close()
        return cache[width]
    return at


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_cleanly_with_images_and_links(site, seen, path):
    html, base = site
    facts = seen(1400)[path]
    assert facts["title"], path
    # every image (figures, plots in cell outputs) actually decoded
    assert not facts["broken_images"], f"{path}: images that did not load: {facts['broken_images']}"
    # internal links: the target file exists, and so does the anchor it points to
    for href in facts["hrefs"]:
        if re.match(r"^(https?:|mailto:|javascript:)", href):
            continue
        target = urlparse(urljoin(base + path, href))
        file = html / unquote(target.path.lstrip("/"))
        if file.is_dir():
            file = file / "index.html"
        assert file.is_file(), f"{path}: broken link {href}"
        if target.fragment and file.suffix == ".html":
            ids = set(re.findall(r'id="([^"]+)"', file.read_text(errors="replace")))
            assert unquote(target.fragment) in ids, f"{path}: missing anchor {href}"
    assert not facts["problems"], f"{path}: " + "; ".join(facts["problems"])


def test_notebook_pages_show_their_plots(seen):
    """Pages of notebooks whose stored outputs hold a PNG show at least that many images."""
    import json
    from test_book import ROOT
    checked = 0
    for f in toc_files():
        src = ROOT / f"{f}.ipynb"
        if not src.is_file():
            continue
        pngs = sum("image/png" in o.get("data", {}) for c in json.loads(src.read_text())["cells"]
                   if c["cell_type"] == "code" for o in c.get("outputs", []))
        if not pngs:
            continue
        shown = seen(1400)[f"{f}.html"]["plots"]
        assert shown >= pngs, f"{f}: {pngs} PNG outputs stored, {shown} shown"
        checked += 1
    notebooks_with_plots = [f for f in toc_files() if "scratch/" in f or "concise/" in f]
    if notebooks_with_plots:
        assert checked, "no notebook page with a stored plot was found"


def test_framework_tabs_switch_together(site, browser):
    html, base = site
    pages = [p for p in PAGES if "framework-tabs" in (html / p).read_text(errors="replace")]
    assert pages, "no page uses the framework tabs"
    page, problems = open_at(browser, base + pages[0], 1280, 720)   # Playwright's default window
    tabsets = page.locator(".framework-tabs .sd-tab-set, .sd-tab-set")
    n = tabsets.count()
    assert n >= 2
    for label in ("JAX", "Paddle", "MXNet", "PyTorch"):
        page.locator(".sd-tab-set").first.locator("label", has_text=label).first.click()
        # synchronised: every tab set now shows the chosen framework's panel, and only it
        visible = page.eval_on_selector_all(
            ".sd-tab-set", """(sets, label) => sets.map(s => {
                const labels = [...s.querySelectorAll(':scope > label')];
                const shown = [...s.querySelectorAll(':scope > .sd-tab-content')]
                    .map((c, i) => [labels[i].textContent.trim(), c.offsetParent !== null]);
                return shown.filter(x => x[1]).map(x => x[0]);
            })""", label)
        assert all(v == [label] for v in visible), (label, visible)
    page.close()
    assert not problems, problems



VISIBLE_TABS = """sets => sets.map(s => {
    const labels = [...s.querySelectorAll(':scope > label')];
    return [...s.querySelectorAll(':scope > .sd-tab-content')]
        .map((c, i) => [labels[i].textContent.trim(), c.offsetParent !== null])
        .filter(x => x[1]).map(x => x[0]);
})"""


def test_framework_tabs_put_pytorch_first_and_remember_the_choice_across_pages(site, browser):
    html, base = site
    pages = [p for p in PAGES if 'data-sync-group="framework"' in (html / p).read_text(errors="replace")]
    assert len(pages) >= 2, pages               # the devices steps, the multi-node commands
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        problems = []
        first = context.new_page()
        visit(first, base + pages[0], watch(first, problems))
        labels = first.locator(".sd-tab-set").first.locator(":scope > label").all_text_contents()
        assert [l.strip() for l in labels] == ["PyTorch", "JAX", "Paddle", "MXNet"], labels
        assert all(v == ["PyTorch"] for v in first.eval_on_selector_all(".sd-tab-set", VISIBLE_TABS))
        first.locator(".sd-tab-set").first.locator("label", has_text="JAX").first.click()
        second = context.new_page()          # another page, the same reader's browser
        visit(second, base + pages[1], watch(second, problems))
        shown = second.eval_on_selector_all(".sd-tab-set", VISIBLE_TABS)
        assert shown and all(v == ["JAX"] for v in shown), (pages[1], shown)
        assert not problems, problems
    finally:
        context.close()

def open_at(browser, url, width, height=900):
    page = browser.new_page(viewport={"width": width, "height": height})
    problems = []
    visit(page, url, watch(page, problems))
    return page, problems


SBS_PAGES = ["chapters/comparison/index.html", "chapters/scratch/index.html",
             "chapters/comm/index.html", "chapters/sharded/index.html"]

SHOWN = """boxes => boxes.map(box => [...box.querySelectorAll('.sbs-row')].map(row =>
    [...row.querySelectorAll('.sbs-cell')].filter(c => c.offsetParent !== null)
        .map(c => [c.querySelector('.sbs-label').textContent.trim(),
                   Math.round(c.getBoundingClientRect().left),
                   Math.round(c.getBoundingClientRect().top)])
        .sort((a, b) => a[1] - b[1])))"""


@pytest.mark.parametrize("path", SBS_PAGES)
def test_side_by_side_view_shows_any_two_frameworks_aligned(site, browser, path):
    html, base = site
    page, problems = open_at(browser, base + path, 1400)
    assert page.locator(".sbs").count() >= 1, f"{path}: no side-by-side view"

    def rows():
        return [r for box in page.eval_on_selector_all(".sbs", SHOWN) for r in box]

    # the default pair, then every other pair, chosen with the menus
    pairs = [("PyTorch", "JAX"), ("Paddle", "MXNet"), ("MXNet", "JAX"), ("JAX", "Paddle")]
    for left, right in pairs:
        if (left, right) != pairs[0]:
            page.locator(".sbs-left").first.select_option(label=left)
            page.locator(".sbs-right").first.select_option(label=right)
        got = rows()
        assert len(got) >= 4, f"{path}: {len(got)} steps shown"
        for row in got:
            assert [c[0] for c in row] == [left, right], (path, left, right, row)
            assert row[0][2] == row[1][2], f"{path}: the two columns of a step do not align: {row}"
            assert row[0][1] < row[1][1]
    # all side-by-side blocks of the page follow one choice
    menus = page.eval_on_selector_all(".sbs select", "els => els.map(e => e.value)")
    assert set(menus) == {"jax", "paddle"}
    # code wraps inside its column rather than running past it
    over = page.eval_on_selector_all(
        ".sbs-cell.sbs-shown pre", "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).length")
    assert over == 0, f"{path}: {over} code blocks overflow their column"
    page.close()
    assert not problems, problems


@pytest.mark.parametrize("width", [1400, 1280, 1024])
def test_concept_map_fits_the_page(site, browser, width):
    html, base = site
    page, problems = open_at(browser, base + "chapters/comparison/index.html", width)
    table = page.locator(".concept-map table")
    assert table.count() == 1
    fit = table.evaluate("""t => {
        const box = t.parentElement;
        const last = t.querySelector('thead th:last-child').getBoundingClientRect();
        return {scroll: box.scrollWidth, client: box.clientWidth, table: t.scrollWidth,
                right: last.right, view: window.innerWidth,
                header: t.querySelector('thead th:last-child').textContent.trim()};
    }""")
    assert fit["header"] == "MXNet"                 # PyTorch, JAX, Paddle, MXNet: the last column
    assert fit["scroll"] <= fit["client"] + 1, f"concept map overflows at {width}px: {fit}"
    assert fit["right"] <= fit["view"], f"the MXNet column is cut off at {width}px: {fit}"
    page.close()
    assert not problems, problems


@pytest.mark.parametrize("path", ["chapters/comparison/index.html", "chapters/scratch/index.html",
                                  "chapters/devices/index.html", "chapters/concise/index.html",
                                  "chapters/comm/index.html", "chapters/sharded/index.html"])
def test_code_never_runs_past_its_box(site, browser, path):
    """A long line either wraps or scrolls inside its box; it is never drawn outside it."""
    html, base = site
    page, problems = open_at(browser, base + path, 1400)
    spill = page.eval_on_selector_all("pre", """els => els.filter(e => e.offsetParent !== null)
        .filter(e => e.scrollWidth > e.clientWidth + 1
                     && !['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
        .map(e => e.textContent.slice(0, 60))""")
    assert not spill, f"{path}: code drawn outside its box: {spill}"
    page.close()
    assert not problems, problems


# -- what a reader sees: tables, lines, the side-by-side view, the concept map -----------------

# A Markdown table row shown as text: a cell printed with display(Markdown(...)) that was
# rendered as a paragraph of pipes (myst-nb's default, CommonMark, has no tables).
MARKDOWN_ROW = re.compile(r"\|\s*:?(-{3,}|—+):?\s*\|")


def printed_markdown_tables(path):
    """How many Markdown tables the stored outputs of a page's notebook print (cells whose
    output is shown)."""
    import json
    from test_book import ROOT
    src = ROOT / path.replace(".html", ".ipynb")
    if not src.is_file():
        return 0
    return sum(1 for c in json.loads(src.read_text())["cells"] if c["cell_type"] == "code"
               and not {"remove-cell", "remove-output"} & set(c["metadata"].get("tags", []))
               for o in c.get("outputs", [])
               if MARKDOWN_ROW.search("".join(o.get("data", {}).get("text/markdown", ""))))


def test_no_page_shows_a_markdown_table_as_text(seen):
    """Every table a cell prints with display(Markdown(...)) is a table on its page: no
    visible text outside the code a reader reads (cell inputs, code blocks) has a `|---|`
    row, and each page shows at least as many tables in its outputs as its notebook prints."""
    shown, missing = [], []
    for path, facts in seen(1400).items():
        shown += [f"{path}: {line.strip()[:80]}" for line in facts["text"].splitlines()
                  if MARKDOWN_ROW.search(line)]
        if facts["tables"] < printed_markdown_tables(path):
            missing.append(f"{path}: {printed_markdown_tables(path)} printed, "
                           f"{facts['tables']} rendered")
    assert not shown, "Markdown tables shown as text:\n" + "\n".join(shown)
    assert not missing, "printed Markdown tables not rendered as tables:\n" + "\n".join(missing)


# Every character of an element's text with its box on the screen: where a line wraps.
_CHARS = """const CHARS = el => {
        const out = [];
        const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
        for (let n; (n = walk.nextNode()); )
            for (let i = 0; i < n.length; i++) {
                const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
                out.push({ch: n.data[i], box: r.getBoundingClientRect()});
            }
        return out;
    };"""


def with_chars(function: str) -> str:
    """A JavaScript function (source) that can call CHARS(el), for eval_on_selector_all."""
    return f"(() => {{ {_CHARS} return {function}; }})()"


@pytest.mark.parametrize("width", [1280, 1400])
def test_no_line_of_code_or_output_is_cut(seen, width):
    """On a laptop's and a desktop's screen, no visible line of code or output is cut at the
    right edge of its box (a <pre> that would need scrolling): long lines wrap, under their
    own code."""
    cut = [f"{path}: {line!r}" for path, facts in seen(width).items() for line in facts["cut"]]
    assert not cut, f"lines cut at {width}px:\n" + "\n".join(cut)


@pytest.mark.parametrize("width", [1280, 1400])
def test_every_table_fits_the_text_column(seen, width):
    """On a laptop's screen and a desktop's, no table is wider than the text column (a table
    that scrolls sideways hides its last columns): a table too wide is split or narrowed."""
    wide = [f"{path}: {t}" for path, facts in seen(width).items() for t in facts["wide"]]
    assert not wide, f"tables wider than the text column at {width}px:\n" + "\n".join(wide)


def test_the_text_column_uses_a_wide_screen(site, browser):
    """At 1400 px the text column is well over the theme's 780 px, and a wrapped line of code
    continues to the right of where its code starts, never at the left margin."""
    html, base = site
    page, problems = open_at(browser, base + "chapters/concise/pytorch.html", 1400)
    width = page.evaluate("document.querySelector('article.bd-article section > p').clientWidth")
    assert width >= 850, f"text column {width}px at 1400px"
    hang = page.eval_on_selector_all("article .code-line", with_chars("""ls => ls.flatMap(l => {
        const chars = CHARS(l).filter(c => c.box.width)
            .map(c => [c.ch, c.box.left, c.box.top, c.box.width]);
        const code = chars.find(c => c[0] !== ' ');
        const next = chars.find(c => c[2] > chars[0][2] + 2);
        if (!code || !next || parseInt(l.style.getPropertyValue('--indent')) >= 24) return [];
        return next[1] >= code[1] + 2 * code[3] ? [] : [l.textContent.slice(0, 60)];
    })"""))
    assert not hang, f"wrapped lines that continue left of their code: {hang}"
    page.close()
    assert not problems, problems


COPY_PAGES = ["chapters/comparison/index.html", "chapters/scratch/index.html",
              "chapters/concise/index.html"]


@pytest.mark.parametrize("path", COPY_PAGES)
def test_side_by_side_copy_button_copies_code_that_runs(site, browser, path):
    """What the copy button of a side-by-side block puts on the clipboard (clicked, and read
    back from the clipboard) is Python with its real indentation: it compiles."""
    html, base = site
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base.rstrip("/"))
    page = context.new_page()
    visit(page, base + path, watch(page, []))
    cells = page.locator(".sbs-cell.sbs-shown")
    assert cells.count() >= 4
    copied = []
    for i in range(cells.count()):
        cell = cells.nth(i)
        cell.locator("pre").hover()
        cell.locator("button.copybtn").click()
        text = page.evaluate("navigator.clipboard.readText()")
        label = cell.locator(".sbs-label").text_content()
        assert text.strip(), f"{path}: cell {i} ({label}) copied nothing"
        try:
            compile(text, f"{path} cell {i} ({label})", "exec")
        except SyntaxError as e:
            pytest.fail(f"{path}: the copy of cell {i} ({label}) does not compile: {e}\n{text}")
        shown = cell.locator("pre").evaluate(
            "e => [...e.querySelectorAll('.code-line')].map(l => l.textContent).join('\\n')")
        assert text.rstrip("\n") == shown.rstrip("\n"), f"{path}: cell {i} copies other text"
        copied.append(text)
    assert any("\n    " in t for t in copied), f"{path}: no block copied with its indentation"
    context.close()


@pytest.mark.parametrize("width", [1280, 1400])
def test_side_by_side_code_is_legible(site, browser, width):
    """The side-by-side code is set no smaller than 13 px, and a half column holds at least
    56 characters at 1280 px, 62 at 1400 px (the view takes the contents sidebar's width)."""
    html, base = site
    page, problems = open_at(browser, base + "chapters/comparison/index.html", width)
    got = page.eval_on_selector_all(".sbs-cell.sbs-shown pre", """els => els.map(e => {
        const probe = document.createElement('span'); probe.textContent = '0'.repeat(100);
        e.appendChild(probe); const ch = probe.getBoundingClientRect().width / 100; probe.remove();
        const cs = getComputedStyle(e);
        return [parseFloat(cs.fontSize),
                (e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)) / ch,
                e.getBoundingClientRect().right]; })""")
    assert got
    for size, chars, right in got:
        assert size >= 13, f"side-by-side code at {size}px"
        assert chars >= (56 if width < 1400 else 62), f"{chars:.0f} characters a line at {width}px"
        assert right <= width, f"the side-by-side view runs past the window at {width}px"
    page.close()
    assert not problems, problems


@pytest.mark.parametrize("width", [1400, 1280, 1024])
def test_concept_map_breaks_identifiers_only_between_their_parts(site, browser, width):
    """An identifier in the concept map wraps only after . _ ( , / , between the words of a
    CamelCase name or at a space -- never mid-word ("torch.cuda.device_coun / t()") -- and
    never runs out of its cell."""
    html, base = site
    page, problems = open_at(browser, base + "chapters/comparison/index.html", width)
    bad = page.eval_on_selector_all(".concept-map td code", with_chars("""codes => codes.flatMap(c => {
        const chars = CHARS(c).map(ch => [ch.ch, ch.box.top, ch.box.right]);
        const out = [];
        const cell = c.closest('td').getBoundingClientRect();
        for (let i = 1; i < chars.length; i++)
            if (chars[i][1] > chars[i - 1][1] + 2 && chars[i][0] !== ' '
                && !'._(,/ '.includes(chars[i - 1][0])
                && !(/[a-z]/.test(chars[i - 1][0]) && /[A-Z]/.test(chars[i][0])))
                out.push('broken: ' + c.textContent.slice(0, i) + ' / ' + c.textContent.slice(i));
        if (chars.some(ch => ch[2] > cell.right + 1)) out.push('out of its cell: ' + c.textContent);
        return out;
    })"""))
    assert not bad, f"at {width}px: {bad}"
    page.close()
    assert not problems, problems

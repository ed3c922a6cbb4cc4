"""The rendered book in a real browser (Debian's headless Chromium, driven by Playwright):
every page loads without console errors, the framework tabs switch, figures and plots are
present, and no internal link or anchor is broken."""
import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from test_book import toc_files

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


def open_page(browser, url):
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(url, wait_until="networkidle")
    return page, problems


PAGES = [f"{f}.html" for f in toc_files()]


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_cleanly_with_images_and_links(site, browser, path):
    html, base = site
    page, problems = open_page(browser, base + path)
    assert page.title(), path
    # every image (figures, plots in cell outputs) actually decoded
    broken = page.eval_on_selector_all(
        "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).map(e => e.src)")
    assert not broken, f"{path}: images that did not load: {broken}"
    # internal links: the target file exists, and so does the anchor it points to
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    for href in hrefs:
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
    page.close()
    assert not problems, f"{path}: " + "; ".join(problems)


def test_notebook_pages_show_their_plots(site, browser):
    """Pages of notebooks whose stored outputs hold a PNG show at least that many images."""
    import json
    html, base = site
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
        page, _ = open_page(browser, base + f"{f}.html")
        shown = page.eval_on_selector_all(".cell_output img", "els => els.length")
        assert shown >= pngs, f"{f}: {pngs} PNG outputs stored, {shown} shown"
        page.close()
        checked += 1
    notebooks_with_plots = [f for f in toc_files() if "scratch/" in f or "concise/" in f]
    if notebooks_with_plots:
        assert checked, "no notebook page with a stored plot was found"


def test_framework_tabs_switch_together(site, browser):
    html, base = site
    pages = [p for p in PAGES if "framework-tabs" in (html / p).read_text(errors="replace")]
    assert pages, "no page uses the framework tabs"
    page, problems = open_page(browser, base + pages[0])
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

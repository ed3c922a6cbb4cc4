"""JupyterLab as ``make lab`` starts it (tools/lab.py): it listens on loopback only, refuses a
request without its token, and in headless Chromium a chapter notebook opens with the book's
kernel and its first cells execute through the server."""
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from helpers import free_port
from test_browser import CHROMIUM, FLAGS  # (skips the module without Chromium)
from tools import lab

pytestmark = pytest.mark.browser   # JupyterLab in headless Chromium

NOTEBOOK = "chapters/devices/pytorch.ipynb"
EXPECTED = "one entry per device: True"     # printed by the notebook's third code cell


def get(url, timeout=10):
    """(status, body) of a GET, HTTP errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server of ``make lab`` on a copy of the book: JupyterLab writes checkpoints and
    autosaves executed notebooks, and the checkout's stored outputs must stay as they are."""
    tmp = tmp_path_factory.mktemp("lab")
    book = tmp / "book"
    shutil.copytree(lab.ROOT / "chapters", book / "chapters",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_TOKEN=token, D2LMINI_PROFILE="smoke",
               D2LMINI_NUM_DEVICES="2", CUDA_VISIBLE_DEVICES="",
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    log = open(tmp / "server.log", "w+")
    proc = subprocess.Popen(lab.lab_command(port, root_dir=book), stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"jupyter lab exited:\n{log.read()[-3000:]}")
            try:
                if get(f"{base}/api/status?token={token}", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            log.seek(0)
            pytest.fail(f"jupyter lab did not answer in 120 s:\n{log.read()[-3000:]}")
        yield base, token, port
    finally:
        for sig, wait in ((15, 20), (9, 10)):
            try:
                os.killpg(proc.pid, sig)            # the server and its kernels
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def test_the_command_listens_on_loopback_with_a_token():
    cmd = lab.lab_command(8888)
    assert "--ServerApp.ip=127.0.0.1" in cmd
    assert not any("0.0.0.0" in c or "token=" in c.lower() or "password" in c.lower()
                   for c in cmd)


def test_a_request_without_the_token_is_refused(server):
    base, token, _ = server
    status, _ = get(f"{base}/api/contents/chapters")
    assert status == 403
    status, _ = get(f"{base}/api/contents/chapters?token=wrong{token}")
    assert status == 403
    status, body = get(f"{base}/api/contents/chapters?token={token}")
    assert status == 200 and "devices" in {c["name"] for c in json.loads(body)["content"]}


def test_the_server_is_not_reachable_from_other_addresses(server):
    _, _, port = server
    outside = [a for a in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None,
                                                                socket.AF_INET)}
               if not a.startswith("127.")]
    for addr in outside:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((addr, port)) != 0, f"jupyter lab answers on {addr}"


def test_the_books_kernel_is_registered(server):
    base, token, _ = server
    status, body = get(f"{base}/api/kernelspecs?token={token}")
    specs = json.loads(body)
    assert status == 200 and lab.KERNEL in specs["kernelspecs"], specs
    assert specs["kernelspecs"][lab.KERNEL]["spec"]["display_name"] == lab.KERNEL_DISPLAY_NAME


@contextlib.contextmanager
def lab_page(server, notebook):
    """A headless Chromium page with ``notebook`` open in the server's JupyterLab."""
    from playwright.sync_api import sync_playwright
    base, token, _ = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            # a fresh workspace each time: the default one would restore the notebooks an
            # earlier test opened, and the one asked for could open behind them, unseen
            page.goto(f"{base}/lab/workspaces/{secrets.token_hex(4)}/tree/{notebook}"
                      f"?token={token}&reset")
            yield page
        finally:
            browser.close()


def test_a_chapter_notebook_runs_in_the_browser(server):
    with lab_page(server, NOTEBOOK) as page:
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        # the kernel the notebook runs on, as the status bar shows it
        page.wait_for_selector(f"text={lab.KERNEL_DISPLAY_NAME}", timeout=120_000)
        # ... and has started: keys pressed while it starts can be lost on a loaded machine
        page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]',
                               timeout=180_000)
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.keyboard.press("Escape")                 # command mode, first cell selected
        for _ in range(7):                            # 2 markdown cells, then code/markdown
            page.keyboard.press("Shift+Enter")
        page.wait_for_selector(f".jp-OutputArea-output >> text={EXPECTED}",
                               timeout=180_000)
        outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
        # the third code cell's line, which needs the Setup's devices: the Setup ran
        assert any(EXPECTED in o for o in outputs), outputs
        assert not page.locator(".jp-OutputArea-output[data-mime-type="
                                "'application/vnd.jupyter.stderr'] >> text=Error").count()


def test_the_books_folded_blocks_render_in_jupyterlab(server):
    """The notebooks' deep dives are MyST ``:::{dropdown}`` blocks; JupyterLab renders them
    (jupyterlab-myst) as folded blocks, not as raw fences."""
    with lab_page(server, "chapters/scratch/pytorch.ipynb") as page:
        page.wait_for_selector(".jp-Notebook .jp-MarkdownCell details summary",
                               timeout=120_000)
        cell = page.locator(".jp-Notebook .jp-MarkdownCell",
                            has=page.locator("details summary")).first
        rendered = cell.inner_text()
        assert ":::" not in rendered, rendered[:500]           # no raw MyST fence
        assert cell.locator("details summary").first.inner_text().strip()   # a title
        assert cell.locator("details").first.get_attribute("open") is None   # folded

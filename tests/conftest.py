"""Shared fixtures: the book is built once per test session (warnings are errors)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Build the whole book into a temporary directory; return (html_dir, build_log)."""
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).with_name("jupyter-book")
    r = subprocess.run([str(jb), "build", str(ROOT), "--path-output", str(out),
                        "--warningiserror", "--nitpick", "--keep-going"],
                       capture_output=True, text=True, timeout=900)
    log = r.stdout + r.stderr
    assert r.returncode == 0, "book build failed:\n" + log[-6000:]
    return out / "_build" / "html", log


PENDING = ROOT / "tests" / "notebooks_pending.txt"


def pending_notebooks() -> dict[str, str]:
    """Notebooks whose nbval run is not yet verified: ``path  reason`` per line."""
    if not PENDING.is_file():
        return {}
    out = {}
    for line in PENDING.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            path, _, reason = line.partition(" ")
            out[path] = reason.strip() or "pending verification"
    return out


def pytest_collection_modifyitems(config, items):
    """Skip -- visibly, with the reason -- the cells of notebooks listed as pending."""
    pending = pending_notebooks()
    if not pending:
        return
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix() \
            if str(item.fspath).startswith(str(ROOT)) else None
        if rel in pending:
            item.add_marker(pytest.mark.skip(reason=f"{rel}: {pending[rel]}"))

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

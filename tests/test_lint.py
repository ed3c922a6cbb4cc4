"""The linter: ruff with the small rule set of pyproject.toml ([tool.ruff.lint]: pyflakes and
syntax errors) over the book's Python -- d2lmini, the tools, the tests, the chapters' scripts
and the Sphinx extensions.  ruff is pinned in requirements-common.txt (make venv)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

PATHS = ["d2lmini", "tools", "tests", "conftest.py", "chapters", "_ext"]


def ruff():
    exe = Path(sys.executable).with_name("ruff")
    found = str(exe) if exe.is_file() else shutil.which("ruff")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed: make venv installs it (requirements-common.txt)")
        pytest.skip("ruff is not installed here: make venv installs it")
    return found


def test_the_code_passes_the_linter():
    r = subprocess.run([ruff(), "check", "--output-format", "concise", *PATHS], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_linter_finds_an_unused_import(tmp_path):
    (tmp_path / "bad.py").write_text("import os\n")
    r = subprocess.run([ruff(), "check", "--config", str(ROOT / "pyproject.toml"),
                        "--output-format", "concise", str(tmp_path / "bad.py")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "F401" in r.stdout, r.stdout + r.stderr

"""The book's records are found from any install of d2lmini (``d2lmini.locations``): editable
(the package in the checkout), copied into site-packages as ``pip install .`` does, or a
checkout named by ``D2LMINI_BOOK``; otherwise a clear error says what to set."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from d2lmini import locations
from helpers import ROOT

PROBE = """
import json, d2lmini, d2lmini.commcost as cc
out = {"package": d2lmini.__file__, "benchmarks": str(cc.BENCHMARKS)}
try:
    out["h200_step_ms"] = cc.resnet18_step_times(256)["measured, H200, JAX"].seconds * 1e3
except FileNotFoundError as e:
    out["error"] = str(e)
print("PROBE " + json.dumps(out))
"""


def test_the_checkout_is_found_and_a_wrong_one_refused(monkeypatch, tmp_path):
    assert locations.book_root() == ROOT
    assert locations.records("h200-2026-11-27") == ROOT / "benchmarks" / "h200-2026-11-27"
    monkeypatch.setenv("D2LMINI_BOOK", str(tmp_path))
    with pytest.raises(locations.BookNotFound, match="point it at the repository's root"):
        locations.book_root()


def installed_copy_run(site, cwd, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("D2LMINI_BOOK", None)
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("PROBE ", 1)[1])


def test_a_copy_in_site_packages_finds_the_records_from_a_notebooks_folder(tmp_path):
    """The package copied out of the checkout (what a wheel install puts in site-packages):
    run from a chapter's folder it finds the checkout above it, from elsewhere it says to set
    D2LMINI_BOOK, and with D2LMINI_BOOK set it finds it again."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "d2lmini", site / "d2lmini",
                    ignore=shutil.ignore_patterns("__pycache__"))
    got = installed_copy_run(site, ROOT / "chapters" / "comm")
    assert got["package"].startswith(str(site))
    assert got["benchmarks"] == str(ROOT / "benchmarks") and got["h200_step_ms"] > 0
    away = installed_copy_run(site, tmp_path)
    assert "error" in away and "D2LMINI_BOOK" in away["benchmarks"] + away["error"]
    named = installed_copy_run(site, tmp_path, {"D2LMINI_BOOK": str(ROOT)})
    assert named["benchmarks"] == str(ROOT / "benchmarks") and named["h200_step_ms"] > 0

"""Shared fixtures: the book is built once per test session (warnings are errors)."""
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT


def pytest_collection_modifyitems(items):
    """Every test of the built book is ``slow``: it waits for the whole book to build."""
    for item in items:
        if "built_book" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


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


H100_NAME = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def host(monkeypatch):
    """Pretend the host has the given NVIDIA GPUs (as nvidia-smi would report them)."""
    from d2lmini import hardware
    h100 = hardware.GpuInfo(0, H100_NAME, (9, 0), 81559, "580.65")

    def set_gpus(n, profile="smoke", requested=None):
        monkeypatch.setattr(hardware, "nvidia_gpus", lambda: [h100] * n)
        monkeypatch.setenv("D2LMINI_PROFILE", profile)
        if requested is None:
            monkeypatch.delenv("D2LMINI_NUM_DEVICES", raising=False)
        else:
            monkeypatch.setenv("D2LMINI_NUM_DEVICES", str(requested))
    return set_gpus

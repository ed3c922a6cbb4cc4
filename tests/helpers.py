"""What several test files need, once: the repository's root, a fake ``nvidia-smi``, a busy
port, a free one, the book's Sphinx extensions as modules.  (``tests/`` is on the path under
pytest: ``from helpers import ROOT``.)"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import socket
import sys
from pathlib import Path

from d2lmini.launch import free_port  # noqa: F401 -- the tests' free port is the launcher's

ROOT = Path(__file__).resolve().parents[1]


def fake_nvidia_smi(directory: Path, script: str) -> Path:
    """An executable ``nvidia-smi`` in ``directory`` whose shell body is ``script``; returns
    the directory (put it first on ``PATH``: :func:`path_with`)."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script.rstrip("\n") + "\n")
    smi.chmod(0o755)
    return directory


def one_gpu_smi(directory: Path, line: str) -> Path:
    """A fake ``nvidia-smi`` that answers every query with the GPU line ``line``
    (``"0, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.65"``)."""
    return fake_nvidia_smi(directory, f'echo "{line}"')


def path_with(directory: Path) -> str:
    """``PATH`` with ``directory`` first."""
    return f"{directory}{os.pathsep}{os.environ['PATH']}"


@contextlib.contextmanager
def busy_port(port: int, host: str = "127.0.0.1", dual_stack: bool = False):
    """Occupy ``port`` (listening), as another job would -- on IPv6 and IPv4 at once with
    ``dual_stack`` where the host has IPv6; if something else holds it already, it is busy
    all the same.  Yields the port."""
    sock = None
    try:
        if dual_stack:
            try:
                sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(("::", port))
            except OSError as e:
                if sock is not None:
                    sock.close()
                sock = None
                if e.errno == errno.EADDRINUSE:
                    yield port
                    return
                host = "0.0.0.0"                  # no IPv6 here: occupy IPv4 only
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError as e:
                sock.close()
                sock = None
                if e.errno != errno.EADDRINUSE:
                    raise
        if sock is not None:
            sock.listen()
        yield port
    finally:
        if sock is not None:
            sock.close()


def load_ext(name: str):
    """One of the book's Sphinx extensions (``_ext/<name>.py``) as a module, as Sphinx loads
    it (its siblings importable by name, ``_ext`` being an extension folder, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    for sibling in ("frameworktabs",):          # what the others import by name
        if sibling != name and sibling not in sys.modules:
            load_ext(sibling)
    spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

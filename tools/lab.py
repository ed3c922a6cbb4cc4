"""Run the book's notebooks interactively: JupyterLab on this machine (``make lab``).

    .venv/bin/python -m tools.lab [--port 8888]

The server listens on 127.0.0.1 only and asks for a token (Jupyter generates one and prints
the URL that carries it; ``JUPYTER_TOKEN`` sets your own). Notebooks open with the kernel
``d2l`` ("Python (d2l book)"), the venv that ``make venv`` registered it from, so they import
``d2lmini`` and all four frameworks.

On a remote GPU server, start it there and reach it through an SSH tunnel from your laptop,
never by listening on a public address:

    ssh -N -L 8888:127.0.0.1:8888 you@gpu-server     # on your laptop; then open the URL
                                                     # the server printed, token included

The command is built here once, for ``make lab`` and for ``tests/test_lab.py``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "d2l"
KERNEL_DISPLAY_NAME = "Python (d2l book)"


def lab_command(port: int, python: str = sys.executable, root_dir: Path = ROOT) -> list[str]:
    """The JupyterLab server command: loopback only, token required, the book's kernel.
    As root (containers, CI) Jupyter refuses to start without ``--allow-root``."""
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [python, "-m", "jupyterlab", "--no-browser", *root,
            "--ServerApp.ip=127.0.0.1",               # never 0.0.0.0: reach it by SSH tunnel
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root_dir}",
            "--ServerApp.allow_remote_access=False",
            f"--MappingKernelManager.default_kernel_name={KERNEL}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=int(os.environ.get("LAB_PORT", 8888)))
    args = ap.parse_args(argv)
    if os.environ.get("JUPYTER_TOKEN", "unset") == "":
        ap.error("JUPYTER_TOKEN is empty: that would let anyone on this machine in; unset it "
                 "(Jupyter then makes a token) or set a secret one")
    cmd = lab_command(args.port)
    if "--allow-root" in cmd:
        print("warning: running as root; the notebooks' code will run as root too", flush=True)
    print(f"JupyterLab on 127.0.0.1:{args.port} (token in the URL below). From another "
          f"machine: ssh -N -L {args.port}:127.0.0.1:{args.port} <this host>", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    raise SystemExit(main())

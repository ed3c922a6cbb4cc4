"""Execute notebooks in place (refreshing their stored outputs) and report the time each took.

    python tools/execute_notebooks.py chapters/scratch            # every notebook below
    python tools/execute_notebooks.py chapters/devices/jax.ipynb  # one notebook

The profile is whatever D2LMINI_PROFILE says (default: cpu without GPUs, gpu with them).
Each notebook runs in a fresh kernel of this interpreter, from its own directory.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 1800) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - t0
    nbformat.write(nb, path)
    return seconds


def main(args):
    paths = []
    for a in args or ["chapters"]:
        p = Path(a)
        paths += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts) \
            if p.is_dir() else [p]
    for p in paths:
        print(f"{p}: {execute(p):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

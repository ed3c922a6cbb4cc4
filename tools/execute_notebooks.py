"""Execute notebooks in place (refreshing their stored outputs) and report the time each took.

    python -m tools.execute_notebooks chapters/scratch            # every notebook below
    python -m tools.execute_notebooks chapters/devices/jax.ipynb  # one notebook

The profile is whatever D2LMINI_PROFILE says (default: cpu without GPUs, gpu with them).
The book stores every notebook's outputs from the cpu profile with 8 simulated devices
(``d2lmini.config.STORED_DEVICES``; the intro says so and tests/test_book.py holds every page to
it): without GPUs, an unset D2LMINI_NUM_DEVICES means that count here, not the lessons' 2.
Each notebook runs in a fresh kernel of this interpreter, from its own directory.
"""
import os
import shutil
import sys
from pathlib import Path

import nbformat

from tools.notebooks import execute_in_kernel


def execute(path: Path, timeout: int = 1800) -> float:
    nb, seconds = execute_in_kernel(path, timeout)
    nbformat.write(nb, path)
    return seconds


def main(args):
    if "D2LMINI_NUM_DEVICES" not in os.environ and shutil.which("nvidia-smi") is None \
            and os.environ.get("D2LMINI_PROFILE", "cpu") == "cpu":
        from d2lmini.config import STORED_DEVICES
        os.environ["D2LMINI_NUM_DEVICES"] = str(STORED_DEVICES)
        print(f"D2LMINI_NUM_DEVICES={STORED_DEVICES}: the device count of the stored outputs",
              flush=True)
    paths = []
    for a in args or ["chapters"]:
        p = Path(a)
        paths += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts) \
            if p.is_dir() else [p]
    for p in paths:
        print(f"{p}: {execute(p):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

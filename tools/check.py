"""``make check``: the quick loop before a commit (about 3 minutes with one notebook changed).

    python -m tools.check                      # fast unit tests + the notebooks that changed
    python -m tools.check chapters/scratch/jax.ipynb ...   # fast unit tests + these notebooks
    python -m tools.check --list               # say what would run, run nothing

* Unit tests: every test under ``tests/`` but those marked ``slow``, ``launches`` or
  ``browser`` (the book build, launched ranks and schedulers, headless Chromium; markers in
  ``pyproject.toml``), which only ``make test`` runs, and those marked ``harness`` (the test
  machinery's own) unless a file of the machinery (:data:`HARNESS`) changed.
* Notebooks: those changed since main's last commit (``git diff`` against the merge base
  with ``main``, plus uncommitted and untracked files), and every notebook of a chapter whose
  other files (scripts, recipes, results) changed -- checked by nbval under the smoke profile
  with ``D2LMINI_NUM_DEVICES=2``, as the first pass of ``make test`` does.

``make test`` stays the contract (every test, k = 1, 2 and 8); CI runs it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What only `make test` runs (pytest markers, pyproject.toml).
LEFT_TO_MAKE_TEST = ("slow", "launches", "browser")
#: The test machinery: when one of these changed, the tests marked ``harness`` run too (they
#: start pytest sessions and kernels of their own: about a third of the unit tests' CPU).
HARNESS = ("conftest.py", "tests/conftest.py", "tests/helpers.py", "tools/test_durations.py",
           "tools/check.py", "tests/test_harness.py", "Makefile", "pyproject.toml")


def git(*args: str) -> list[str]:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return [l for l in r.stdout.splitlines() if l.strip()] if r.returncode == 0 else []


def changed_files() -> set[str]:
    """Paths changed since main's last commit: committed on this branch, uncommitted,
    untracked."""
    base = (git("merge-base", "HEAD", "main") or git("rev-parse", "HEAD") or [None])[0]
    files = set(git("diff", "--name-only", base)) if base else set()
    files |= set(git("ls-files", "--others", "--exclude-standard"))
    return files


def changed_notebooks(files: set[str]) -> list[Path]:
    chapters = ROOT / "chapters"
    out = set()
    for f in files:
        p = ROOT / f
        if not p.is_relative_to(chapters) or len(p.relative_to(chapters).parts) < 2:
            continue
        chapter = chapters / p.relative_to(chapters).parts[0]
        if p.suffix == ".ipynb":
            if p.is_file():
                out.add(p)
        elif p.suffix != ".md":                   # a script, recipe or results file
            out.update(chapter.glob("*.ipynb"))
    return sorted(q for q in out if ".ipynb_checkpoints" not in q.parts)


def marker_expression(files: set[str] | None = None) -> str:
    """The pytest ``-m`` expression of the unit tests to run: not what :data:`LEFT_TO_MAKE_TEST`
    marks, and not ``harness`` unless one of :data:`HARNESS` changed."""
    files = changed_files() if files is None else files
    left = list(LEFT_TO_MAKE_TEST) + ([] if files & set(HARNESS) else ["harness"])
    return "not (" + " or ".join(left) + ")"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebooks to check (default: those changed)")
    ap.add_argument("--list", action="store_true", help="print what would run, run nothing")
    ap.add_argument("-n", "--workers", type=int, default=3,
                    help="pytest-xdist worker processes (default 3)")
    args = ap.parse_args(argv)
    files = changed_files()
    notebooks = ([Path(n).resolve() for n in args.notebooks] if args.notebooks
                 else changed_notebooks(files))
    missing = [str(n) for n in notebooks if not n.is_file()]
    if missing:
        print("check: no such notebook: " + ", ".join(missing), file=sys.stderr)
        return 2
    marks = marker_expression(files)
    print(f"check: the unit tests under tests/ ({marks}), {len(notebooks)} notebook(s)"
          + (": " + ", ".join(str(n.relative_to(ROOT)) for n in notebooks) if notebooks else ""),
          flush=True)
    if args.list:
        return 0
    env = dict(os.environ, D2LMINI_PROFILE="smoke", D2LMINI_NUM_DEVICES="2")
    # one pytest run over worker processes, as `make test` (the tests wait on subprocesses and
    # kernels much of the time); a notebook or a test file is one unit of work (conftest.py)
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", str(args.workers),
                            "--dist", "loadfile", "-m", marks, "tests",
                            *[str(n.relative_to(ROOT)) for n in notebooks]], cwd=ROOT, env=env)

if __name__ == "__main__":
    raise SystemExit(main())

"""``make check``: the quick loop before a commit (about 3 minutes with one notebook changed).

    python tools/check.py                      # fast unit tests + the notebooks that changed
    python tools/check.py chapters/scratch/jax.ipynb ...   # fast unit tests + these notebooks
    python tools/check.py --list               # say what would run, run nothing

* Unit tests: every ``tests/test_*.py`` except the slow ones in :data:`SLOW` (the book build,
  the browsers, launched multi-process and fault runs, the GPU-run pipeline), which only
  ``make test`` runs, and those of :data:`WHEN_CHANGED` (the harness's own tests) unless
  their files changed.
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
SLOW = {                       # what only `make test` runs, and why it is slow
    "test_book.py": "builds the whole book",
    "test_browser.py": "the built book in headless Chromium",
    "test_lab.py": "JupyterLab in headless Chromium",
    "test_faults_pytorch.py": "launches ranks and kills them",
    "test_faults_paddle.py": "launches ranks and kills them",
    "test_multinode.py": "launches simulated nodes",
    "test_gpu_run.py": "runs notebooks through tools/gpu_run.py",
    "test_recipes.py": "trains the eight recipe scripts",
}


# Unit tests of the test machinery itself: run when it changed (they start pytest sessions and
# kernels of their own: 107 s of CPU, a third of the unit tests'), always by `make test`.
WHEN_CHANGED = {
    "test_harness.py": ("conftest.py", "tools/test_durations.py", "tools/check.py",
                        "tests/test_harness.py", "Makefile"),
}


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


def unit_tests(files: set[str] | None = None) -> list[Path]:
    """The unit tests; those of :data:`WHEN_CHANGED` only when one of their files changed."""
    files = changed_files() if files is None else files
    return sorted(p for p in (ROOT / "tests").glob("test_*.py") if p.name not in SLOW
                  and (p.name not in WHEN_CHANGED or files & set(WHEN_CHANGED[p.name])))


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
    tests = unit_tests(files)
    targets = tests + notebooks
    skipped = sorted(SLOW) + [t for t in WHEN_CHANGED if ROOT / "tests" / t not in tests]
    print(f"check: {len(tests)} unit test files (not: "
          f"{', '.join(sorted(skipped))}), {len(notebooks)} notebook(s)"
          + (": " + ", ".join(str(n.relative_to(ROOT)) for n in notebooks) if notebooks else ""),
          flush=True)
    if args.list:
        return 0
    env = dict(os.environ, D2LMINI_PROFILE="smoke", D2LMINI_NUM_DEVICES="2")
    # one pytest run over worker processes, as `make test` (the tests wait on subprocesses and
    # kernels much of the time); a notebook or a test file is one unit of work (conftest.py)
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", str(args.workers),
                            "--dist", "loadfile",
                            *[str(t.relative_to(ROOT)) for t in targets]], cwd=ROOT, env=env)

if __name__ == "__main__":
    raise SystemExit(main())

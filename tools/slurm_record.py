"""Refresh the record of the cluster runs that the cluster page shows
(chapters/comparison/slurm/record/): run tests/test_slurm.py against a real two-node Slurm on
this machine (root, Debian's slurm-wlm and munge: make slurm) and, when every job passed its
checks, store what the jobs printed.

    python -m tools.slurm_record

The record holds the lines of each job's output the page shows (``shown`` in the test) and a
manifest of the scripts' digests, which tests/test_slurm.py compares with the scripts of the
day: a changed script needs a new record.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "chapters" / "comparison" / "slurm" / "record"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "D2LMINI_SLURM_RECORD": tmp, "D2LMINI_PROFILE": "smoke"}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "tests" / "test_slurm.py"), "-k", "not record"],
                           cwd=ROOT, env=env)
        if r.returncode:
            print("the cluster tests failed or were skipped: the record is unchanged", file=sys.stderr)
            return 1
        files = sorted(Path(tmp).iterdir())
        if not any(f.suffix == ".txt" for f in files):
            print("no job ran (Slurm missing?): the record is unchanged", file=sys.stderr)
            return 1
        shutil.rmtree(RECORD, ignore_errors=True)
        RECORD.mkdir(parents=True)
        for f in files:
            shutil.copy(f, RECORD / f.name)
    print(f"record written to {RECORD.relative_to(ROOT)}: {', '.join(f.name for f in files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why the concise chapter's one-device accuracies differ although the runs compute the same
thing: float32 rounding, amplified by training.  Writes chapters/concise/rounding.json, which
the results page renders.

Every run starts from the same weights (d2lmini.resnet18_init) and takes the same SGD steps
on the same batches in the same order (the `cpu` profile's concise settings):

- the loss of the first STEPS steps in MXNet, PyTorch and JAX, and in PyTorch with 1 and with
  2 intra-op threads (the same program, the same framework, sums in another order);
- the whole run (every epoch) in each of those four, and its test accuracy by the book's
  BatchNorm rule: how far rounding alone moves the accuracy (PyTorch with 1 and 2 threads),
  and how far apart the frameworks end when they take exactly the same steps.

    .venv/bin/python -m tools.rounding [--steps 60]      # about 10 minutes on 2 cores
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from d2lmini import results

ROOT = Path(__file__).resolve().parents[1]

RUNS = [("mxnet", 1), ("torch", 1), ("torch", 2), ("jax", 1)]


def run(fw, threads, steps):
    env = dict(os.environ, D2LMINI_NUM_DEVICES="1", JAX_PLATFORMS="cpu",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(threads),
               XLA_FLAGS=os.environ.get("XLA_FLAGS", ""),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, "-m", "tools._rounding_worker", fw, str(threads),
                        str(steps)], capture_output=True, text=True, env=env, timeout=1800,
                       cwd=str(ROOT / "chapters" / "concise" / "recipe"))
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"{fw} ({threads} threads) failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default=str(ROOT / "chapters" / "concise" / "rounding.json"))
    args = p.parse_args()
    trajectories = []
    for fw, threads in RUNS:
        print(f"{fw}, {threads} thread(s): {args.steps} steps", flush=True)
        trajectories.append(run(fw, threads, args.steps))
    whole = []
    for fw, threads in RUNS:
        print(f"{fw}, {threads} thread(s): the whole run", flush=True)
        whole.append(run(fw, threads, "all"))
    out = {"profile": "cpu", "steps": args.steps, "trajectories": trajectories,
           "whole_runs": whole, "hardware": results.hardware_info(),
           "versions": results.versions(), "date": results._dt.datetime.now(
               results._dt.timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

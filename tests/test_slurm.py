"""The cluster page's scripts under a real Slurm: ``chapters/comparison/slurm/*.sbatch``, as
the page shows them, submitted with ``sbatch --wait`` to a two-node cluster started on this
machine (``tools/local_slurm.py``: munge, slurmctld, ``slurmd -N n1`` and ``-N n2``, private
configuration, free ports), once for the whole module and torn down after it.

* every framework's multi-node proof (k ranks on two nodes == full-batch gradient descent)
  and the PyTorch and Paddle concise recipes, run side by side;
* faults (PyTorch, ``multinode_checks.py``): a rank that raises ends the job FAILED with its
  error in bounded time; ``scancel`` ends every rank; a requeued job resumes from its
  checkpoint and still equals full-batch gradient descent.

Every job's output is written to ``_build/slurm-record/`` (``D2LMINI_SLURM_RECORD`` elsewhere:
``python -m tools.slurm_record`` refreshes the committed record the page shows).  Slurm and munge
come from Debian (``make slurm``, as root); without them, or not as root, the module is
skipped locally and fails under CI.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d2lmini.frameworks import KEYS

from tools import local_slurm

pytestmark = pytest.mark.launches   # starts a scheduler, its nodes and their ranks

ROOT = Path(__file__).resolve().parents[1]

HERE = ROOT / "chapters" / "comparison"
SBATCH = HERE / "slurm"
RECIPES = ROOT / "chapters" / "concise" / "recipe"
COMMITTED = SBATCH / "record"
RECORD = Path(os.environ.get("D2LMINI_SLURM_RECORD") or ROOT / "_build" / "slurm-record")
JOB_TIMEOUT = 240            # s: the last resort for one job; none comes near it
# CPU ranks everywhere (the rendezvous and the collectives are what run here; two "nodes"
# on one GPU host would share its GPU 0); Paddle's CPU build must not see the variable, and
# its GPU build cannot be sent to the CPU (test_multinode.py skips it; here it would fail).
CPU = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
PADDLE_CPU = {"CUDA_VISIBLE_DEVICES": None}     # its launcher takes even "" as a GPU list
RECIPE = ["--epochs", "1", "--batch-size", "32", "--train-samples", "64", "--test-samples",
          "64", "--width", "4"]

# name: (sbatch script, program and its options, environment, sbatch's options); each job
# runs in a directory of its own, where the proofs write results/rank{r}.json.  The JAX recipe
# is one process driving one machine's devices (2 simulated CPU devices here): one node.
JOBS = {
    "torch-proof": ("torch.sbatch", [HERE / "multinode_torch.py", "--out", "results"], CPU, []),
    "jax-proof": ("jax.sbatch", [HERE / "multinode_jax.py", "--out", "results"], CPU, []),
    "paddle-proof": ("paddle.sbatch", [HERE / "multinode_paddle.py", "--out", "results"],
                     PADDLE_CPU, []),
    "torch-recipe": ("torch.sbatch", [RECIPES / "pytorch_dp.py", *RECIPE], CPU, []),
    "paddle-recipe": ("paddle.sbatch", [RECIPES / "paddle_dp.py", *RECIPE], PADDLE_CPU, []),
    "jax-recipe": ("jax.sbatch", [RECIPES / "jax_dp.py", *RECIPE],
                   {**CPU, "D2LMINI_NUM_DEVICES": "2"}, ["--nodes=1"]),
}
CHECKS = HERE / "multinode_checks.py"
# The files whose runs the record shows: a change to one of them needs a new record.
SOURCES = [*sorted(SBATCH.glob("*.sbatch")), HERE / "multinode_torch.py", HERE / "multinode_jax.py",
           HERE / "multinode_paddle.py", CHECKS, RECIPES / "pytorch_dp.py", RECIPES / "paddle_dp.py"]
# The lines of a job's output the page shows: the scripts' own and Slurm's; the frameworks'
# log chatter (Paddle's launcher, gloo) is left out.
SHOWN = re.compile(r"^(task \d|\{|epoch \d|rank \d|srun: |slurmstepd\S*: |(\[rank\d\]: )?RuntimeError)")


def sources_digest() -> dict:
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in SOURCES}


def shown(text: str) -> str:
    """The lines of a job's output the page shows, each once, in order."""
    seen, out = set(), []
    for line in text.splitlines():
        if SHOWN.match(line) and line not in seen:
            seen.add(line)
            out.append(line)
    return "\n".join(out) + "\n"


def record(name: str, job, command: str) -> None:
    RECORD.mkdir(parents=True, exist_ok=True)
    (RECORD / f"{name}.txt").write_text(
        f"$ {command}\n{shown(job.output)}[job {job.job_id}: {job.state}, exit code "
        f"{job.exit_code}, {job.seconds:.0f} s]\n")
    manifest = RECORD / "manifest.json"
    data = json.loads(manifest.read_text()) if manifest.exists() else {}
    data["sources"] = sources_digest()
    data.setdefault("jobs", {})[name] = {"state": job.state, "exit_code": job.exit_code,
                                         "seconds": round(job.seconds, 1)}
    manifest.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def command(script: str, args, extra=()) -> str:
    """The command as a reader types it in chapters/comparison/."""
    def rel(a):
        a = str(a)
        for base, shown_as in ((str(SBATCH) + "/", "slurm/"), (str(HERE) + "/", ""),
                               (str(RECIPES) + "/", "../concise/recipe/")):
            if a.startswith(base):
                return shown_as + a[len(base):]
        return a
    return " ".join(["sbatch", *extra, rel(SBATCH / script), *(rel(a) for a in args)])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = local_slurm.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm cannot run in CI: {why}", pytrace=False)
        pytest.skip(why)
    cluster = local_slurm.LocalSlurm(str(tmp_path_factory.mktemp("slurm")))
    try:
        cluster.start()
    except local_slurm.SlurmUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm did not start in CI: {e}", pytrace=False)
        pytest.skip(f"Slurm did not start here: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers(), "processes of the test cluster still run after stop()"


def job_env(extra: dict) -> dict:
    return {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "MASTER_PORT": str(local_slurm._free_ports(1)[0]), **extra}


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """The jobs of :data:`JOBS`, submitted together; ``jobs(name)`` waits for one."""
    started, done = {}, {}
    for name, (script, args, env, options) in JOBS.items():
        out = tmp_path_factory.mktemp(name)
        shown_env = "".join(f"{k}={v} " for k, v in env.items() if k.startswith("D2LMINI_"))
        started[name] = (cluster.sbatch_start([*options, str(SBATCH / script), *map(str, args)],
                                              str(out), env=job_env(env), output=f"{name}-%j.out"),
                         out / "results", shown_env + command(script, args, options))

    def result(name):
        if name not in done:
            pending, out, cmd = started[name]
            done[name] = (pending.result(JOB_TIMEOUT), out)
            record(name, done[name][0], cmd)
        return done[name]
    yield result
    for name in started:          # a job no test waited for is not left running
        result(name)


def completed(job):
    assert job.state == "COMPLETED" and job.exit_code == 0, \
        f"job {job.job_id}: {job.state}, exit code {job.exit_code}:\n{job.output[-3000:]}"


def rank_results(out: Path, world: int, pattern="rank{rank}.json") -> list[dict]:
    return [json.loads((out / pattern.format(rank=r)).read_text()) for r in range(world)]


def equals_full_batch(results, world=2):
    assert [r.get("rank", r.get("process_id")) for r in results] == list(range(world))
    assert all(r.get("world_size", r.get("process_count")) == world for r in results)
    assert all(r["max_abs_diff_vs_one_process"] < 1e-5 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results


def test_srun_numbers_the_tasks_and_names_the_nodes(cluster, jobs):
    """What the page's table reads: four tasks, two on each node, and the node list expanded."""
    step = ["srun", "-N", "2", "--ntasks-per-node=2", "--label", "bash", "-c",
            'echo "SLURM_PROCID=$SLURM_PROCID SLURM_LOCALID=$SLURM_LOCALID '
            'SLURM_NODEID=$SLURM_NODEID SLURMD_NODENAME=$SLURMD_NODENAME '
            'SLURM_NTASKS=$SLURM_NTASKS SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"']
    r = cluster.run(step, timeout=60)
    lines = sorted(r.stdout.splitlines())
    hosts = cluster.run(["scontrol", "show", "hostnames", "n[1-2]"]).stdout
    RECORD.mkdir(parents=True, exist_ok=True)
    (RECORD / "slurm-env.txt").write_text(
        f"$ {shlex.join(step)}\n" + "\n".join(lines) + '\n$ scontrol show hostnames "n[1-2]"\n' + hosts)
    got = [dict(kv.split("=", 1) for kv in line.split(": ", 1)[1].split()) for line in lines]
    assert [g["SLURM_PROCID"] for g in got] == ["0", "1", "2", "3"], r.stdout
    assert [(g["SLURM_NODEID"], g["SLURMD_NODENAME"], g["SLURM_LOCALID"]) for g in got] == \
        [("0", "n1", "0"), ("0", "n1", "1"), ("1", "n2", "0"), ("1", "n2", "1")], r.stdout
    assert {g["SLURM_JOB_NODELIST"] for g in got} == {"n[1-2]"}
    assert {g["SLURM_NTASKS"] for g in got} == {"4"}
    assert hosts.split() == ["n1", "n2"]


def fault_job(cluster, tmp_path, env, extra_sbatch=(), args=()):
    cmd = [*extra_sbatch, str(SBATCH / "torch.sbatch"), str(CHECKS), "--out", "results", *args]
    return cluster.sbatch_start(cmd, str(tmp_path), env=job_env({**CPU, **env}),
                                output="job-%j.out"), tmp_path / "results"


def wait_for_line(path_glob: Path, pattern: str, timeout: float, pending) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in path_glob.parent.glob(path_glob.name):
            text = p.read_text(errors="replace")
            if re.search(pattern, text, re.M):
                return text
        if pending.proc.poll() is not None:
            break
        time.sleep(0.3)
    pytest.fail(f"no line /{pattern}/ in the job's output within {timeout:.0f} s")


def test_a_rank_that_raises_ends_the_job_with_its_error(cluster, jobs, tmp_path):
    pending, _ = fault_job(cluster, tmp_path, {"D2LMINI_FAIL_RANK": "1", "D2LMINI_FAIL_STEP": "1"},
                           args=["--timeout", "120"])
    job = pending.result(JOB_TIMEOUT)
    record("fault-raise", job, command("torch.sbatch", [CHECKS, "--out", "results"])
           .replace("sbatch", "D2LMINI_FAIL_RANK=1 D2LMINI_FAIL_STEP=1 sbatch", 1))
    assert job.state == "FAILED" and job.exit_code != 0 and job.returncode != 0, job
    assert "RuntimeError: injected failure on rank 1 at step 1" in job.output, job.output
    assert re.search(r"srun: error: n2: task 1: Exited with exit code [1-9]", job.output), job.output
    # rank 0, waiting in the all-reduce, was ended by srun, not by its 120 s collective timeout
    assert job.seconds < 60, f"the job took {job.seconds:.0f} s to fail"
    assert not cluster.job_processes(job.job_id)


def test_scancel_ends_every_rank(cluster, jobs, tmp_path):
    pending, _ = fault_job(cluster, tmp_path, {"D2LMINI_FAIL_RANK": "1", "D2LMINI_FAIL_STEP": "1",
                                               "D2LMINI_FAIL_MODE": "hang"})
    wait_for_line(tmp_path / "job-*.out", r"^rank 1 hangs at step 1", 120, pending)
    procs = cluster.job_processes(pending.job_id)
    ranks = [p for p in procs if "multinode_checks.py" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(ranks) >= 2, f"expected both ranks running, found {procs}"
    t0 = time.monotonic()
    cluster.run(["scancel", str(pending.job_id)])
    job = pending.result(60)
    record("fault-scancel", job, "scancel JOBID   # the job: " + command(
        "torch.sbatch", [CHECKS, "--out", "results"]))
    assert job.state == "CANCELLED", job
    deadline = time.monotonic() + 20
    while cluster.job_processes(job.job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cluster.job_processes(job.job_id), "ranks still run after scancel"
    assert time.monotonic() - t0 < 30


def test_a_requeued_job_resumes_from_its_checkpoint(cluster, jobs, tmp_path):
    ckpt = tmp_path / "ckpt.pt"           # the job runs in tmp_path: --checkpoint ckpt.pt
    extra = ["--requeue", "--open-mode=append"]
    pending, out = fault_job(cluster, tmp_path, {"D2LMINI_FAIL_RANK": "1", "D2LMINI_FAIL_STEP": "2",
                                                 "D2LMINI_FAIL_MODE": "hang"},
                             extra_sbatch=extra, args=["--steps", "4", "--checkpoint", "ckpt.pt"])
    wait_for_line(tmp_path / "job-*.out", r"^rank 1 hangs at step 2", 120, pending)
    time.sleep(1)                             # rank 0's checkpoint after step 2 is written
    assert ckpt.exists()
    cluster.run(["scontrol", "requeue", str(pending.job_id)])
    job = pending.result(JOB_TIMEOUT)
    record("fault-requeue", job, command("torch.sbatch", [CHECKS, "--out", "results", "--steps",
                                                         "4", "--checkpoint", "ckpt.pt"], extra)
           + "\n$ scontrol requeue JOBID   # while rank 1 hangs at step 2")
    completed(job)
    results = rank_results(out, 2)
    equals_full_batch(results)
    assert all(r["resumed_after_step"] >= 1 for r in results), results
    assert "resuming from" in job.output


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_the_proof_on_two_nodes_equals_full_batch_descent(jobs, framework):
    job, out = jobs(f"{framework}-proof")
    completed(job)
    equals_full_batch(rank_results(out, 2))
    # one rank on each node, numbered by Slurm
    nodes = re.findall(r"^task (\d) on (n\d)", job.output, re.M)
    assert sorted(nodes) == [("0", "n1"), ("1", "n2")], job.output


def test_jax_finds_its_process_id_and_count_in_slurm(jobs):
    job, out = jobs("jax-proof")
    completed(job)
    results = rank_results(out, 2, "process{rank}.json")
    equals_full_batch(results)
    assert all(r["global_devices"] == 4 and r["local_devices"] == 2 for r in results)
    assert sorted(re.findall(r"^task (\d) on (n\d)", job.output, re.M)) == [("0", "n1"), ("1", "n2")]


@pytest.mark.parametrize("framework", [f for f in KEYS if f != "mxnet"])  # MXNet: one node
def test_the_concise_recipe_trains_under_slurm(jobs, framework):
    """PyTorch and Paddle: one rank on each of the two nodes; JAX: one process, one node."""
    job, _ = jobs(f"{framework}-recipe")
    completed(job)
    tasks = sorted(re.findall(r"^task (\d) on (n\d)", job.output, re.M))
    assert tasks == ([("0", "n1")] if framework == "jax" else [("0", "n1"), ("1", "n2")]), job.output
    lines = re.findall(r"^epoch 1: loss ([\d.]+), test accuracy ([\d.]+) \((\d+) devices", job.output, re.M)
    assert lines, job.output[-3000:]
    loss, acc, k = lines[0]
    assert int(k) == 2 and 0 < float(loss) < 10 and 0 <= float(acc) <= 1


@pytest.mark.parametrize("script", ["torch.sbatch", "jax.sbatch", "paddle.sbatch"])
def test_a_script_run_wrongly_says_how_to_run_it(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", str(SBATCH / script), "multinode_torch.py"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "submit this script with sbatch" in r.stderr, r.stderr
    r = subprocess.run(["bash", str(SBATCH / script)], env={**env, "SLURM_JOB_ID": "7"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and f"usage: sbatch slurm/{script} PROGRAM.py" in r.stderr, r.stderr


def test_the_page_shows_a_record_of_these_scripts():
    manifest = COMMITTED / "manifest.json"
    assert manifest.exists(), "no record of the cluster runs: python -m tools.slurm_record"
    data = json.loads(manifest.read_text())
    stale = [p for p, h in sources_digest().items() if data["sources"].get(p) != h]
    assert not stale, (f"{stale} changed since the record the cluster page shows was made: "
                       "python -m tools.slurm_record (as root, with Slurm)")
    names = {*JOBS, "fault-raise", "fault-scancel", "fault-requeue"}
    assert set(data["jobs"]) == names
    assert {p.stem for p in COMMITTED.glob("*.txt")} == {*names, "slurm-env"}
    page = (HERE / "cluster.md").read_text()
    for name in sorted(names | {"slurm-env"}):      # the page shows every run it records
        assert f"slurm/record/{name}.txt" in page, name
    for script in SBATCH.glob("*.sbatch"):            # and the very scripts that ran
        assert f"{{literalinclude}} slurm/{script.name}" in page, script.name

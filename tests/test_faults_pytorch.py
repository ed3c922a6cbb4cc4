"""Faults of multi-process PyTorch training never hang: chapters/concise/ddp_train.py, run
through chapters/concise/ddp_checks.py (which injects the faults; the lesson's script has none).

Every test launches the real script with 2 processes on a tiny configuration (128 training
images, width 4, one epoch), through ``d2lmini.launch.run`` and the same launchers as the
notebook (``torchrun`` = ``python -m torch.distributed.run``, and the script's own
``torch.multiprocessing.spawn``):

1. a process that raises ends the launch with a non-zero exit, quickly (long before the
   collective timeout), and its error text is in ``LaunchError.log``; a process that stops
   responding ends it after the collective timeout;
2. a busy rendezvous port: with torchrun's default port 29500 occupied, a launch on
   ``launch.free_port()`` succeeds and a launch *on* the busy port fails at once;
3. a normal run returns per-process results whose parameters are bit-identical.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from d2lmini import launch
from helpers import busy_port

pytestmark = pytest.mark.launches   # launches torchrun ranks and kills them

SCRIPT = Path(__file__).resolve().parents[1] / "chapters" / "concise" / "ddp_checks.py"
TINY = ["--profile", "smoke", "--train-samples", "128", "--test-samples", "64", "--width", "4",
        "--epochs", "1", "--batch-size", "64", "--bn-batches", "1", "--predict", "8"]
DEFAULT_PORT = 29500          # torchrun's --master_port default
COLLECTIVE_TIMEOUT = 120      # s, the script's --timeout unless a test sets it
LAUNCH_TIMEOUT = 300          # s, the last resort; no test may come near it


def torchrun(out, *, port, nproc=2, extra=()):
    return [launch.python(), "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(port), "--max-restarts", "0", str(SCRIPT), *TINY,
            "--out", str(out), *extra]


def spawn(out, *, port, nproc=2, extra=()):
    return [launch.python(), str(SCRIPT), "--launcher", "spawn", "--nprocs", str(nproc),
            "--master-port", str(port), *TINY, "--out", str(out), *extra]


def run(cmd, env=None, timeout=LAUNCH_TIMEOUT):
    """launch.run, returning (LaunchResult or LaunchError, seconds)."""
    # CPU processes (gloo) even on a GPU host: the fault handling under test is gloo's and
    # the launchers'; NCCL's watchdog behaves differently and is not what these tests pin.
    env = {"CUDA_VISIBLE_DEVICES": "", **(env or {})}
    t0 = time.perf_counter()
    try:
        outcome = launch.run(cmd, timeout=timeout, env=env, cwd=str(SCRIPT.parent))
    except launch.LaunchError as e:
        outcome = e
    return outcome, time.perf_counter() - t0


@pytest.fixture(scope="module")
def busy_default_port():
    """Occupy torchrun's default port (IPv4 and IPv6) for the module, as another job would.
    If something else holds it already, it is busy all the same."""
    with busy_port(DEFAULT_PORT, dual_stack=True):
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            with pytest.raises(OSError):
                probe.bind(("0.0.0.0", DEFAULT_PORT))
        finally:
            probe.close()
        yield DEFAULT_PORT


@pytest.fixture(scope="module")
def normal_run(busy_default_port, tmp_path_factory):
    """One ordinary 2-process torchrun job on a free port, while the default port is busy."""
    out = tmp_path_factory.mktemp("normal")
    outcome, seconds = run(torchrun(out, port=launch.free_port()))
    return out, outcome, seconds


# -------------------------------------------------------------------- 1. failing processes
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_raising_rank_fails_fast_with_its_error(launcher, tmp_path):
    cmd = (torchrun if launcher == "torchrun" else spawn)(tmp_path, port=launch.free_port())
    outcome, seconds = run(cmd, env={"D2LMINI_FAIL_RANK": 1, "D2LMINI_FAIL_STEP": 1})
    assert isinstance(outcome, launch.LaunchError), "the launch should have failed"
    assert outcome.returncode not in (0, None), "failed by itself, not killed on a timeout"
    assert "injected failure on rank 1 at step 1" in outcome.log
    # The peer's crash is noticed through its closed connections, not the collective timeout.
    assert seconds < COLLECTIVE_TIMEOUT
    assert not (tmp_path / "rank0.json").exists()


def test_hanging_rank_ends_after_collective_timeout(tmp_path):
    timeout = 5
    cmd = torchrun(tmp_path, port=launch.free_port(), extra=["--timeout", str(timeout)])
    outcome, seconds = run(cmd, env={"D2LMINI_FAIL_RANK": 1, "D2LMINI_FAIL_STEP": 1,
                                     "D2LMINI_FAIL_MODE": "hang"})
    assert isinstance(outcome, launch.LaunchError)
    assert outcome.returncode not in (0, None), "torchrun ended it, not the launcher timeout"
    assert "rank 1 hangs at step 1" in outcome.log
    assert "Timed out" in outcome.log                  # rank 0's collective gave up
    assert timeout <= seconds < LAUNCH_TIMEOUT


# -------------------------------------------------------------------- 2. busy port
def test_free_port_launch_succeeds_while_default_port_busy(normal_run):
    out, outcome, _ = normal_run
    assert isinstance(outcome, launch.LaunchResult), getattr(outcome, "log", "")[-3000:]
    assert len(launch.read_rank_results(out, 2)) == 2


def test_launch_on_busy_port_fails_fast(busy_default_port, tmp_path):
    outcome, seconds = run(torchrun(tmp_path, port=busy_default_port), timeout=120)
    assert isinstance(outcome, launch.LaunchError)
    assert outcome.returncode not in (0, None), "it must fail by itself, not hang"
    assert "EADDRINUSE" in outcome.log or "address already in use" in outcome.log
    assert seconds < 120


# -------------------------------------------------------------------- 3. a normal run
def test_normal_run_ranks_hold_identical_parameters(normal_run):
    out, outcome, _ = normal_run
    assert isinstance(outcome, launch.LaunchResult)
    r0, r1 = launch.read_rank_results(out, 2)
    assert (r0["rank"], r1["rank"]) == (0, 1) and r0["world_size"] == r1["world_size"] == 2
    assert r0["backend"] in ("gloo", "nccl")
    assert r0["param_sha256"] == r1["param_sha256"]
    assert r0["epoch_param_sha256"] == r1["epoch_param_sha256"]
    assert r0["buffer_sha256"] == r1["buffer_sha256"]        # after calibrate_batchnorm
    assert r0["test_acc"] == r1["test_acc"]                  # one all-reduced accuracy
    assert (out / "checkpoint.pt").is_file() and len(r0["predictions"]) == 8

"""Fault handling of the concise chapter's Paddle script, chapters/concise/paddle_train.py, run
through chapters/concise/paddle_checks.py (which injects the faults; the lesson's script has none).

A launch must never hang: a rank that raises fails the whole job quickly, with a non-zero
exit code and that rank's traceback in the error; a busy rendezvous port fails fast, and a
port from ``free_port()`` works; a normal run gives identical replicas on every rank.
Runs are tiny (128 training images, width 4), 2 ranks, gloo on the CPU.
"""
import time
from pathlib import Path

import pytest

pytest.importorskip("paddle")

from d2lmini import launch  # noqa: E402
from d2lmini import paddle as d2l  # noqa: E402
from helpers import busy_port  # noqa: E402

pytestmark = pytest.mark.launches   # launches Paddle ranks and kills them

SCRIPT_DIR = Path(__file__).resolve().parents[1] / "chapters" / "concise"
TIMEOUT = 120            # the outer limit; every test must finish well before it
TINY = ["--train_samples", "128", "--test_samples", "64", "--epochs", "1",
        "--batch_size", "32", "--lr", "0.05", "--width", "4"]
ENV = {"D2LMINI_PROFILE": "smoke"}
# Two ranks need two GPUs with a Paddle GPU build (Paddle cannot share a GPU, and its launcher
# takes any CUDA_VISIBLE_DEVICES, even "", as a GPU list); the CPU build runs gloo ranks.
if d2l.num_gpus() == 1:
    pytest.skip("a Paddle GPU build with one GPU cannot start 2 ranks (see d2l.rank_env)",
                allow_module_level=True)
PADDLE_DEFAULT_START_PORT = 6070   # the launcher's --start_port default (used with --ips)


def launch_cmd(out, *extra, start_port=None):
    port = ["--start_port", str(start_port)] if start_port is not None else []
    return [launch.python(), "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
            "--ips", "127.0.0.1", *port, "--log_dir", str(Path(out) / "logs"),
            "paddle_checks.py", "--out", str(out), *TINY, *extra]


def spawn_cmd(out, *extra):
    return [launch.python(), "paddle_checks.py", "--launcher", "spawn", "--nprocs", "2",
            "--port", str(launch.free_port()), "--out", str(out), *TINY, *extra]


def run(kind, out, env=None, **kw):
    env = {**ENV, **(env or {})}
    if kind == "launch":
        return d2l.run_launch(launch_cmd(out, **kw), log_dir=Path(out) / "logs",
                              timeout=TIMEOUT, env=env, cwd=str(SCRIPT_DIR))
    return launch.run(spawn_cmd(out), timeout=TIMEOUT, env=env, cwd=str(SCRIPT_DIR))


@pytest.mark.parametrize("kind", ["launch", "spawn"])
def test_raising_rank_fails_fast_with_its_traceback(kind, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(launch.LaunchError) as info:
        run(kind, tmp_path, env={"D2LMINI_FAIL_RANK": "1", "D2LMINI_FAIL_STEP": "1"},
            **({"start_port": launch.free_port()} if kind == "launch" else {}))
    seconds = time.perf_counter() - t0
    err = info.value
    assert err.returncode is not None, f"the job hung and was killed after {TIMEOUT} s"
    assert err.returncode != 0
    assert seconds < TIMEOUT
    assert "injected failure on rank 1 at step 1 (D2LMINI_FAIL_RANK=1: rank 1 fails on purpose)" in err.log
    assert "Traceback" in err.log


@pytest.fixture
def busy_default_port():
    """Occupy the port the launcher uses by default with --ips (6070), unless someone else
    already does; either way it is busy while the test runs."""
    with busy_port(PADDLE_DEFAULT_START_PORT) as port:
        yield port


def test_busy_rendezvous_port_fails_fast(busy_default_port, tmp_path):
    # No --start_port: the ranks would meet on 127.0.0.1:6070, which is taken.
    t0 = time.perf_counter()
    with pytest.raises(launch.LaunchError) as info:
        run("launch", tmp_path)
    assert info.value.returncode is not None, f"the job hung and was killed after {TIMEOUT} s"
    assert info.value.returncode != 0
    assert time.perf_counter() - t0 < TIMEOUT


def test_free_port_run_gives_identical_replicas(busy_default_port, tmp_path):
    port = launch.free_port()
    assert port != busy_default_port
    run("launch", tmp_path, start_port=port)
    logs = launch.read_rank_results(tmp_path, 2)
    assert [log["rank"] for log in logs] == [0, 1]
    assert all(log["world_size"] == 2 for log in logs)
    assert all(log["env"]["PADDLE_MASTER"] == f"127.0.0.1:{port}" for log in logs)
    if not d2l.num_gpus():
        assert all(log["env"]["PADDLE_DISTRI_BACKEND"] == "gloo" for log in logs)
    # DataParallel: identical trainable parameters on every rank, bit for bit
    assert logs[0]["params_sha256"] == logs[1]["params_sha256"]
    # the all-reduced test accuracy is the same on every rank
    assert logs[0]["test_acc"] == logs[1]["test_acc"]
    # each rank trained on its own half of every batch
    assert all(step[3] == 16 for log in logs for step in log["steps"])


def test_the_gloo_start_up_server_stops_when_told_not_3_s_later(tmp_path, monkeypatch):
    """d2lmini.paddle puts its copy of Paddle's key-value server loop (rank 0's, for the gloo
    start-up of init_parallel_env) in Paddle's place: the same loop, which stops once its flag
    says so and every worker has left, looking every 0.05 s instead of every 3 s."""
    import inspect
    import threading

    from paddle.distributed import parallel
    monkeypatch.chdir(tmp_path)            # Paddle's http_server logs to ./http.log on import
    assert parallel._start_kv_server is d2l._start_kv_server
    assert d2l._poll_kv_server_often()                     # idempotent: still in place
    assert list(inspect.signature(parallel._start_kv_server).parameters) == [
        "port", "http_server_d", "size"]
    flag = {"running": True}
    server = threading.Thread(target=d2l._start_kv_server,
                              args=(launch.free_port(), flag, {}), daemon=True)
    server.start()
    time.sleep(0.3)
    assert server.is_alive()                               # serves while the flag is up
    flag["running"] = False
    server.join(timeout=2.5)                               # Paddle's own loop: up to 3 s
    assert not server.is_alive()

"""Multi-node data parallelism, simulated as several launchers on one machine (loopback
rendezvous): PyTorch (torchrun --nnodes 2), Paddle (paddle.distributed.launch --nnodes 2)
and JAX (jax.distributed.initialize with two processes).  Each run must reproduce
full-batch gradient descent computed in NumPy on one process."""
import sys
import time
from pathlib import Path

import pytest

from d2lmini import launch

pytestmark = pytest.mark.launches   # launches simulated nodes of ranks

HERE = Path(__file__).resolve().parents[1] / "chapters" / "comparison"
PY = sys.executable
# The "nodes" share one machine: on a GPU host every one of them would claim GPU 0 (NCCL
# refuses a duplicate GPU) and JAX would preallocate it twice.  The simulation is of the
# rendezvous and the collectives, so it runs on the CPU wherever the tests run.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}


def paddle_env():
    """Paddle's launcher takes any CUDA_VISIBLE_DEVICES, even "", as a list of GPUs, so the
    CPU build must run without it (it sees no GPU anyway); a GPU build cannot be sent to the
    CPU at all, and two "nodes" on one machine would share its GPU 0."""
    from importlib import metadata
    try:
        metadata.version("paddlepaddle-gpu")
    except metadata.PackageNotFoundError:
        return {k: v for k, v in CPU_ONLY.items() if k != "CUDA_VISIBLE_DEVICES"}
    pytest.skip("Paddle GPU build: its launcher cannot be forced onto the CPU, and two "
                "simulated nodes would share one GPU")


def torch_cmds(port, out):
    return [[PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i),
             "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
             "--max_restarts", "0", str(HERE / "multinode_torch.py"), "--out", str(out)]
            for i in range(2)]


def paddle_cmds(port, out):
    return [[PY, "-m", "paddle.distributed.launch", "--nnodes", "2", "--rank", str(i),
             "--nproc_per_node", "1", "--master", f"127.0.0.1:{port}",
             "--log_dir", str(out / f"log{i}"), str(HERE / "multinode_paddle.py"), "--out", str(out)]
            for i in range(2)]


def jax_cmds(port, out, ids=(0, 1), init_timeout=60):
    return [[PY, str(HERE / "multinode_jax.py"), "--process-id", str(i), "--num-processes", "2",
             "--coordinator", f"127.0.0.1:{port}", "--out", str(out),
             "--init-timeout", str(init_timeout)] for i in ids]


def check(results, world):
    assert [r.get("rank", r.get("process_id")) for r in results] == list(range(world))
    assert all(r.get("world_size", r.get("process_count")) == world for r in results)
    assert all(r["max_abs_diff_vs_one_process"] < 1e-5 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results


@pytest.mark.parametrize("framework,cmds", [("torch", torch_cmds), ("paddle", paddle_cmds)])
def test_two_nodes_on_one_machine(tmp_path, framework, cmds):
    c = cmds(launch.free_port(), tmp_path)
    env = paddle_env() if framework == "paddle" else CPU_ONLY
    if framework == "paddle":               # the launcher reads the variable's presence
        c = [["env", "-u", "CUDA_VISIBLE_DEVICES", *cmd] for cmd in c]
    # cwd: Paddle's launcher writes its key-value store's http.log into the working directory
    launch.run_all(c, timeout=300, envs=[env] * len(c), cwd=str(tmp_path))
    check(launch.read_rank_results(tmp_path, 2), 2)


def test_jax_two_processes(tmp_path):
    launch.run_all(jax_cmds(launch.free_port(), tmp_path), timeout=300, envs=[CPU_ONLY] * 2)
    results = launch.read_rank_results(tmp_path, 2, "process{rank}.json")
    check(results, 2)
    assert all(r["global_devices"] == 4 and r["local_devices"] == 2 for r in results)


def test_jax_process_whose_peer_never_comes_fails_fast(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(launch.LaunchError) as e:
        launch.run_all(jax_cmds(launch.free_port(), tmp_path, ids=(1,), init_timeout=5),
                       timeout=120, envs=[CPU_ONLY])
    assert e.value.returncode not in (None, 0)  # the process gave up by itself: no hang
    assert time.perf_counter() - t0 < 100

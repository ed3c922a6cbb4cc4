"""The sharded chapter's recipes (chapters/sharded/recipe/), each at k = 2 on the CPU: each trains
as its framework's data-parallel recipe does, from the same weights on the same batches; each
rank or device keeps about 1/k of what its level shards; PyTorch's DCP checkpoint resumes a run
exactly; and each runs copied alone, without d2lmini."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_recipes import alone_env

pytestmark = pytest.mark.launches   # torchrun, paddle launch and a JAX process per recipe

ROOT = Path(__file__).resolve().parents[1]
SHARDED = ROOT / "chapters" / "sharded" / "recipe"
CONCISE = ROOT / "chapters" / "concise" / "recipe"
K = 2
# Small: the sharding is what is tested, not the training (two epochs of 4 steps).
ARGS = ["--epochs", "2", "--batch-size", "16", "--train-samples", "64", "--test-samples", "32",
        "--width", "4"]
PRINTOUT = re.compile(r"^epoch (\d+): loss (\S+), test accuracy (\S+) \((\d+) devices?, ", re.M)
# Data parallelism all-reduces the gradients, sharding reduce-scatters them: the same sums, in
# another order, so the float32 losses agree to rounding.
LOSS_RTOL = 1e-5


def command(fw, script):
    py, port = sys.executable, str(_port())
    if fw == "pytorch":
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", str(K),
                "--master_port", port, str(script)]
    if fw == "paddle":
        return [py, "-m", "paddle.distributed.launch", "--nproc_per_node", str(K),
                "--log_dir", "logs", "--start_port", port, str(script)]
    return [py, str(script)]


def _port():
    from d2lmini import launch
    return launch.free_port()


def run(fw, script, cwd, extra=(), alone=False):
    """Runs ``script`` at k = 2 in ``cwd``: with d2lmini (the shared weights, ``--out`` JSON) or,
    ``alone``, as a reader's copy (no d2lmini, the data directory named)."""
    cwd.mkdir(parents=True, exist_ok=True)
    if alone:
        from d2lmini.data import find_data_dir
        env = alone_env(fw, K, cwd)
        extra = ["--data", str(find_data_dir()), *extra]
    else:
        env = dict(os.environ, D2LMINI_PROFILE="smoke", D2LMINI_NUM_DEVICES=str(K),
                   OMP_NUM_THREADS="1",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={K} "
                             "--xla_backend_optimization_level=0")
        extra = ["--out", str(cwd / "out.json"), *extra]
    r = subprocess.run(command(fw, script) + ARGS + list(extra), capture_output=True, text=True,
                       env=env, cwd=str(cwd), timeout=300)
    logs = "".join(p.read_text(errors="replace") for p in sorted((cwd / "logs").glob("*"))) \
        if (cwd / "logs").is_dir() else ""
    log = r.stdout + r.stderr + logs
    assert r.returncode == 0, log[-3000:]
    return log


def epochs(log):
    """{epoch: (loss, accuracy)} as printed (Paddle's launcher repeats rank 0's log)."""
    found = {int(e): (float(loss), float(acc)) for e, loss, acc, k in PRINTOUT.findall(log)}
    assert found and all(int(k) == K for *_, k in PRINTOUT.findall(log)), log[-3000:]
    return found


def results(cwd):
    return json.loads((cwd / "out.json").read_text())


def held(log, pattern):
    """{rank: (bytes held, bytes in all)} from the recipes' "holds" lines."""
    return {int(m[0]): (int(m[1]), int(m[2])) for m in re.findall(pattern, log)}


def assert_trains_as_dp(dp, sharded):
    assert len(dp["loss"]) == len(sharded["loss"]) == 2
    assert sharded["loss"] == pytest.approx(dp["loss"], rel=LOSS_RTOL), (dp, sharded)
    assert sharded["test_acc"] == dp["test_acc"]
    assert sharded["loss"][1] < sharded["loss"][0]


def test_pytorch_fsdp_trains_as_ddp_and_each_rank_holds_half(tmp_path):
    run("pytorch", CONCISE / "pytorch_dp.py", tmp_path / "dp")
    log = run("pytorch", SHARDED / "pytorch_fsdp.py", tmp_path / "fsdp")
    assert_trains_as_dp(results(tmp_path / "dp"), results(tmp_path / "fsdp"))
    ranks = held(log, r"rank (\d) holds (\d+) of the (\d+) parameter bytes")
    assert sorted(ranks) == [0, 1], log[-3000:]
    total = {t for _, t in ranks.values()}.pop()
    assert sum(h for h, _ in ranks.values()) == total          # every byte on exactly one rank
    assert all(abs(h - total / K) <= 0.05 * total / K for h, _ in ranks.values()), ranks


def test_pytorch_fsdp_copied_alone_resumes_from_its_checkpoint_exactly(tmp_path):
    """Two epochs straight, and one epoch resumed from the checkpoint the first run saved after
    epoch 1: the same second epoch and the same checkpoint after it, bit for bit -- parameters,
    BatchNorm's statistics and SGD's momentum (sharded state) all round-trip through DCP."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    straight = tmp_path / "straight"
    log_a = run("pytorch", SHARDED / "pytorch_fsdp.py", straight, alone=True,
                extra=["--momentum", "0.9", "--checkpoint", "ckpt"])
    assert sorted(os.listdir(straight / "ckpt")) == ["epoch_1", "epoch_2"]
    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "ckpt" / "epoch_1", resumed / "ckpt" / "epoch_1")
    log_c = run("pytorch", SHARDED / "pytorch_fsdp.py", resumed, alone=True,
                extra=["--momentum", "0.9", "--checkpoint", "ckpt"])
    a, c = epochs(log_a), epochs(log_c)
    assert sorted(a) == [1, 2] and sorted(c) == [2], (a, c)      # resumed after epoch 1
    assert c[2] == a[2] and a[2][0] < a[1][0]
    states = []
    for d in (straight, resumed):
        dcp_to_torch_save(d / "ckpt" / "epoch_2", d / "epoch_2.pt")
        states.append(torch.load(d / "epoch_2.pt", weights_only=False))
    flat = [{f"{part}/{name}": t for part in ("model", "optimizer")
             for name, t in _tensors(s[part])} for s in states]
    assert flat[0].keys() == flat[1].keys()
    assert any("momentum_buffer" in n and t.abs().sum() > 0 for n, t in flat[0].items())
    assert all(torch.equal(flat[0][n], flat[1][n]) for n in flat[0]), \
        [n for n in flat[0] if not torch.equal(flat[0][n], flat[1][n])]
    assert states[0]["epoch"] == states[1]["epoch"] == 2


def _tensors(tree, prefix=""):
    import torch
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _tensors(value, f"{prefix}.{i}")


def test_jax_fsdp_copied_alone_trains_as_jax_dp_and_each_device_holds_half(tmp_path):
    """Both scripts copied alone start from Flax's initial weights at the same seed: the same
    printout (to its three decimals), and device 0 holds half the parameters."""
    dp = epochs(run("jax", CONCISE / "jax_dp.py", tmp_path / "dp", alone=True))
    log = run("jax", SHARDED / "jax_fsdp.py", tmp_path / "fsdp", alone=True)
    fsdp = epochs(log)
    assert fsdp == dp and fsdp[2][0] < fsdp[1][0], (dp, fsdp)
    (params, total), = held(log, r"device (0) holds (\d+) of the (\d+) parameter bytes").values()
    assert abs(params - total / K) <= 0.05 * total / K, (params, total)


def test_paddle_sharding_trains_as_data_parallel(tmp_path):
    run("paddle", CONCISE / "paddle_dp.py", tmp_path / "dp")
    log = run("paddle", SHARDED / "paddle_fsdp.py", tmp_path / "fsdp")
    assert_trains_as_dp(results(tmp_path / "dp"), results(tmp_path / "fsdp"))
    assert "(level os)" in log


def test_paddle_sharding_copied_alone_shards_the_optimizer_state(tmp_path):
    """Each rank keeps the momentum of its own parameters only: the ranks' shares add up to one
    buffer the size of the parameters, and neither holds it all."""
    log = run("paddle", SHARDED / "paddle_fsdp.py", tmp_path, alone=True,
              extra=["--momentum", "0.9"])
    assert sorted(epochs(log)) == [1, 2]
    ranks = held(log, r"rank (\d) holds (\d+) optimizer-state bytes \(level os\); "
                      r"the parameters are (\d+) bytes")
    assert sorted(ranks) == [0, 1], log[-3000:]
    total = {t for _, t in ranks.values()}.pop()
    assert sum(h for h, _ in ranks.values()) == total
    assert all(0 < h < total for h, _ in ranks.values()), ranks


def test_paddle_refuses_a_level_its_cpu_build_cannot_run(tmp_path):
    """group_sharded_parallel stops on the CPU build at every level: the recipe says so at once,
    naming the level that runs."""
    r = subprocess.run([sys.executable, str(SHARDED / "paddle_fsdp.py"), "--level", "p_g_os"],
                       capture_output=True, text=True, env=alone_env("paddle", 1, tmp_path),
                       cwd=str(tmp_path), timeout=120)
    if "needs GPUs" not in r.stderr and r.returncode == 0:
        pytest.skip("this Paddle build has GPUs")
    assert r.returncode == 2 and "--level p_g_os needs GPUs" in r.stderr, r.stderr[-2000:]
    assert "use --level os" in r.stderr


def test_the_sharded_recipes_copy_alone_blocks_are_the_dp_recipes():
    """The sharded recipes carry the DP recipes' reader of Fashion-MNIST and printout word for
    word (a fix made in one copy and not the others fails)."""
    from test_recipes import _alone_functions
    from d2lmini.frameworks import FRAMEWORKS
    for fw in (f.notebook for f in FRAMEWORKS if f.key != "mxnet"):     # MXNet has no recipe
        sharded = _alone_functions(SHARDED / f"{fw}_fsdp.py")[1]
        dp = _alone_functions(CONCISE / f"{fw}_dp.py")[1]
        for name in ("load_data", "report"):
            assert sharded[name] == dp[name], f"{fw}_fsdp.py's {name} differs from {fw}_dp.py's"

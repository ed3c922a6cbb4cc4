"""The concise chapter's recipe scripts (chapters/concise/recipe/): in every framework the
one-device script and the data-parallel one are the same program -- on one device the
data-parallel script computes exactly what the one-device script computes -- and the
data-parallel script refuses a global batch its devices cannot split.  The fast-path script
with no knob turned on is the one-device script too."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from d2lmini.frameworks import NOTEBOOKS
from helpers import ROOT

pytestmark = [pytest.mark.launches, pytest.mark.slow]   # trains the recipes, launches ranks

RECIPE = ROOT / "chapters" / "concise" / "recipe"
FRAMEWORKS = list(NOTEBOOKS)                     # the recipes' file stems: pytorch_dp.py, ...
ARGS = ["--epochs", "2", "--batch-size", "32", "--train-samples", "128", "--test-samples", "64",
        "--width", "4"]


def command(fw, script, k):
    py = sys.executable
    if script.endswith("_dp.py") and fw == "pytorch":
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", str(k),
                "--master_port", str(_port()), str(RECIPE / script)]
    if script.endswith("_dp.py") and fw == "paddle":
        return [py, "-m", "paddle.distributed.launch", "--nproc_per_node", str(k),
                "--log_dir", "logs", "--start_port", str(_port()), str(RECIPE / script)]
    return [py, str(RECIPE / script)]


def _port():
    from d2lmini import launch
    return launch.free_port()


def run(fw, script, k, tmp_path, extra=()):
    out = tmp_path / f"{script}.json"
    env = dict(os.environ, D2LMINI_PROFILE="smoke", D2LMINI_NUM_DEVICES=str(k),
               OMP_NUM_THREADS="1")
    r = subprocess.run(command(fw, script, k) + ARGS + list(extra) + ["--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*")) \
        if (tmp_path / "logs").is_dir() else ""
    return r, out, r.stdout + r.stderr + logs


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_data_parallel_and_fast_scripts_on_one_device_are_the_one_device_script(fw, tmp_path):
    """On one device ``<fw>_dp.py`` computes what ``<fw>_one.py`` computes, and so does
    ``<fw>_fast.py --knobs ''``: the fast path adds settings, nothing else (the diff the chapter
    shows is the whole difference)."""
    r1, out1, log1 = run(fw, f"{fw}_one.py", 1, tmp_path)
    assert r1.returncode == 0, log1[-3000:]
    one = json.loads(out1.read_text())
    assert len(one["loss"]) == 2 and one["devices"] == 1 and "epoch 2: loss" in log1
    for script, extra in ((f"{fw}_dp.py", ()), (f"{fw}_fast.py", ["--knobs="])):
        r, out, log = run(fw, script, 1, tmp_path, extra=extra)
        assert r.returncode == 0, log[-3000:]
        other = json.loads(out.read_text())
        assert len(other["loss"]) == 2 and other["devices"] == 1, (script, other)
        # the same weights, batches and arithmetic: the same losses (to float32 printing) and
        # the same test accuracy
        assert other["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6), (script, one, other)
        assert other["test_acc"] == one["test_acc"], (script, one, other)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_an_uneven_global_batch_is_refused(fw, tmp_path):
    r, out, log = run(fw, f"{fw}_dp.py", 3, tmp_path, extra=["--batch-size", "32"])
    assert r.returncode != 0
    assert "not divisible" in log
    assert not out.exists()


def test_a_knob_the_recipe_does_not_know_is_refused(tmp_path):
    r, out, log = run("jax", "jax_fast.py", 1, tmp_path, extra=["--knobs=donate,turbo"])
    assert r.returncode != 0 and "unknown knobs ['turbo']" in log and "donate, bf16" in log


# ------------------------------------------------------------------ each script copied alone
# A reader who copies one script has its framework and NumPy, not this book's package: with
# `import d2lmini` failing in every process of the run (the launched ranks too: a sitecustomize
# on PYTHONPATH) and the working directory outside the repository, each script still trains.
ALONE_ARGS = ["--epochs", "1", "--batch-size", "16", "--train-samples", "32",
              "--test-samples", "16", "--width", "4"]
NO_D2LMINI = 'import sys\nsys.modules["d2lmini"] = None      # `import d2lmini` fails\n'
# MXNet 1.9.1 imports under NumPy < 2 only, and this environment has NumPy 2 (for JAX): the
# MXNet runs get d2lmini's shim, loaded from its file -- an environment's fix, not the script's.
MXNET_SHIM = ("import importlib.util\n"
              "spec = importlib.util.spec_from_file_location('_mxnet_compat', {path!r})\n"
              "shim = importlib.util.module_from_spec(spec)\n"
              "spec.loader.exec_module(shim)\nshim.install()\n")
PRINTOUT = re.compile(r"^epoch 1: loss (\S+), test accuracy (\S+) \((\d+) devices?, ", re.M)


def alone_env(fw, k, tmp_path):
    """The environment of a copied script's run: no d2lmini, no D2LMINI_* but the device
    count the MXNet script reads; k CPU devices for JAX (XLA unoptimised: compiles 4x faster)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    shim = MXNET_SHIM.format(path=str(ROOT / "d2lmini" / "_mxnet_compat.py"))
    (site / "sitecustomize.py").write_text((shim if fw == "mxnet" else "") + NO_D2LMINI)
    env = {n: v for n, v in os.environ.items() if not n.startswith(("D2LMINI_", "PYTHON"))}
    env.update(PYTHONPATH=str(site), OMP_NUM_THREADS="1", D2LMINI_NUM_DEVICES=str(k),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={k} "
                         "--xla_backend_optimization_level=0")
    return env


def run_alone(fw, script, k, tmp_path, data_dir):
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = alone_env(fw, k, tmp_path)
    blocked = subprocess.run([sys.executable, "-c", "import d2lmini"], env=env, cwd=str(tmp_path),
                             capture_output=True, text=True)
    assert blocked.returncode != 0 and "halted" in blocked.stderr, blocked.stderr
    r = subprocess.run(command(fw, script, k) + ALONE_ARGS + ["--data", str(data_dir)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*")) \
        if (tmp_path / "logs").is_dir() else ""
    return r, r.stdout + r.stderr + logs


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_both_scripts_train_when_copied_alone(fw, tmp_path):
    from d2lmini.data import find_data_dir
    data_dir = find_data_dir()
    for script, k in [(f"{fw}_one.py", 1), (f"{fw}_dp.py", 2)]:
        r, log = run_alone(fw, script, k, tmp_path / script, data_dir)
        assert r.returncode == 0, log[-3000:]
        printout = set(PRINTOUT.findall(log))   # (Paddle's launcher repeats rank 0's log)
        assert len(printout) == 1, log[-3000:]
        loss, acc, devices = printout.pop()
        assert math.isfinite(float(loss)) and 0 <= float(acc) <= 1 and int(devices) == k, log


# A knob of each fast recipe that runs on every CPU: the copied script's knob path, not only its
# defaults.
CPU_KNOB = {"pytorch": "channels_last", "jax": "donate", "paddle": "nhwc", "mxnet": "hybridize"}


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_fast_script_trains_when_copied_alone(fw, tmp_path):
    from d2lmini.data import find_data_dir
    env = alone_env(fw, 1, tmp_path)
    r = subprocess.run(command(fw, f"{fw}_fast.py", 1) + ALONE_ARGS
                       + ["--data", str(find_data_dir()), f"--knobs={CPU_KNOB[fw]}"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (loss, acc, devices), = PRINTOUT.findall(r.stdout)
    assert math.isfinite(float(loss)) and 0 <= float(acc) <= 1 and int(devices) == 1
    bad = subprocess.run(command(fw, f"{fw}_fast.py", 1) + ["--knobs=turbo"], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert bad.returncode != 0 and "unknown knobs ['turbo']" in bad.stderr, bad.stderr[-2000:]


def test_a_copied_script_names_the_missing_data_files(tmp_path):
    (tmp_path / "empty").mkdir()
    r, log = run_alone("pytorch", "pytorch_one.py", 1, tmp_path, tmp_path / "empty")
    assert r.returncode != 0
    assert "train-images-idx3-ubyte.gz is missing" in log and "--data" in log, log[-3000:]


def test_the_book_scripts_take_the_data_directory_too(tmp_path, monkeypatch):
    from d2lmini import recipe
    from d2lmini.data import DataError
    monkeypatch.delenv("D2LMINI_DATA", raising=False)    # --data alone names the directory
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="D2LMINI_DATA=.*empty"):
        recipe.load_data(recipe.parse_args(["--data", str(tmp_path / "empty")]))


# ------------------------------------------------------------------ no host sync per step
# Calls that make the host wait for the device: a loop that makes one per step times the
# host's waiting as well as the step, and the four frameworks' recipes would not time the same
# span (JAX's has none).  Two kinds of host-to-device copy wait too: PyTorch's ``X.to(device)``
# from pageable memory without ``non_blocking=True`` (ATen synchronises the stream after the
# copy), and a tensor built from host values on the device (``torch.tensor(..., device=...)``)
# at every step.  The training scripts the concise notebooks launch are held to the same rule:
# their epoch times are the ones the notebooks print.
SYNC_METHODS = {"item", "asscalar", "asnumpy", "numpy", "tolist", "block_until_ready"}
SYNC_FUNCTIONS = {"float", "int"}
TRAINING_SCRIPTS = [RECIPE / p for p in sorted(q.name for q in RECIPE.glob("*_*.py"))] + [
    ROOT / "chapters" / "concise" / "ddp_train.py", ROOT / "chapters" / "concise" / "paddle_train.py"]


def _true(node) -> bool:
    import ast
    return isinstance(node, ast.Constant) and node.value is True


def host_syncs(node) -> list[str]:
    import ast
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            keywords = {kw.arg: kw.value for kw in n.keywords}
            if isinstance(f, ast.Attribute) and f.attr in SYNC_METHODS:
                found.append(f".{f.attr}() at line {n.lineno}")
            elif isinstance(f, ast.Name) and f.id in SYNC_FUNCTIONS:
                found.append(f"{f.id}() at line {n.lineno}")
            elif (isinstance(f, ast.Attribute) and f.attr == "to" and n.args
                  and not _true(keywords.get("non_blocking"))):
                found.append(f".to() without non_blocking=True at line {n.lineno}")
            elif isinstance(f, ast.Attribute) and f.attr == "tensor" and "device" in keywords:
                found.append(f"tensor(..., device=...) at line {n.lineno}")
    return found


def per_step_syncs(source: str) -> list[str]:
    """Host syncs in every ``train_step`` and in the loop that calls it once per batch (the
    innermost loop or comprehension around each call)."""
    import ast
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "train_step":
            problems += [f"train_step: {s}" for s in host_syncs(node)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "train_step"):
            loop = parent.get(node)
            while loop is not None and not isinstance(
                    loop, (ast.For, ast.ListComp, ast.GeneratorExp)):
                loop = parent.get(loop)
            if loop is not None:
                problems += [f"the loop at line {loop.lineno}: {s}" for s in host_syncs(loop)]
    return problems


@pytest.mark.parametrize("script", TRAINING_SCRIPTS, ids=lambda p: p.name)
def test_no_training_script_waits_for_the_device_at_every_step(script):
    assert per_step_syncs(script.read_text()) == []


def test_the_sync_check_finds_a_per_step_item():
    bad = ("def train_step(m, X):\n    return m(X).item()\n"
           "def main():\n    for X in data:\n        loss = float(train_step(m, X))\n")
    assert per_step_syncs(bad) == ["train_step: .item() at line 2",
                                   "the loop at line 4: float() at line 5"]
    assert per_step_syncs("def main():\n    for X in data:\n        train_step(m, X)\n"
                          "    print(float(x))\n") == []
    copies = ("def main():\n    for X, y in loader:\n"
              "        train_step(m, X.to(device), y.to(device, non_blocking=True))\n"
              "        n += torch.tensor(1.0, device=device)\n")
    assert sorted(per_step_syncs(copies)) == [
        "the loop at line 2: .to() without non_blocking=True at line 3",
        "the loop at line 2: tensor(..., device=...) at line 4"]


# A script copied alone must carry what it takes from d2lmini, so the copy-alone block is
# written once per file by design. These twins are held equal here instead: a fix made in one
# copy and not the others fails.
def _alone_functions(path: Path) -> tuple[str, dict]:
    """(the copy-alone block's text, {function name: source}) of one recipe script."""
    import ast
    from d2lmini.utils import COPY_ALONE_MARKER
    text = path.read_text()
    start = text.index(COPY_ALONE_MARKER)
    first_line = text[:start].count("\n") + 1
    funcs = {n.name: ast.get_source_segment(text, n) for n in ast.walk(ast.parse(text))
             if isinstance(n, ast.FunctionDef) and n.lineno > first_line}
    return text[start:], funcs


def test_the_copy_alone_blocks_are_twins():
    """Each framework's one-device and data-parallel scripts carry the same copy-alone block,
    and the framework-neutral part of it (the command line, the NumPy reader of Fashion-MNIST,
    the printout) is the same text in all eight scripts."""
    neutral = {}
    for fw in FRAMEWORKS:
        (one, f_one), (dp, _) = (_alone_functions(RECIPE / f"{fw}_{kind}.py") for kind in ("one", "dp"))
        assert one == dp, f"{fw}_one.py and {fw}_dp.py differ after the copy-alone marker"
        for name in ("parse_args", "load_data", "report"):
            neutral.setdefault(name, {})[fw] = f_one[name]
    for name, by_fw in neutral.items():
        assert len(set(by_fw.values())) == 1, f"{name} differs between the frameworks' recipes"
    # the fast scripts' blocks: the same reader and printout, and one command line with --knobs
    fast = {fw: _alone_functions(RECIPE / f"{fw}_fast.py")[1] for fw in FRAMEWORKS}
    for fw, funcs in fast.items():
        assert funcs["load_data"] == neutral["load_data"][fw] and \
            funcs["report"] == neutral["report"][fw], f"{fw}_fast.py's copy-alone block differs"
    assert len({funcs["parse_args"] for funcs in fast.values()}) == 1

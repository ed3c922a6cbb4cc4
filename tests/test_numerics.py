"""Exact numerics are scoped: each backend's ``exact_numerics()`` block switches TF32 and
autotuned kernels off for the block only and restores the framework's own settings after it
(also when the block raises); ``D2LMINI_EXACT=1`` makes the whole process exact.  The
benchmarks' TF32 switch for their matrix-product peaks is scoped the same way.

The flags are read in a fresh interpreter per framework, so the import-time arrangements are
the real ones.  On the CPU the flags exist and are honoured by the GPU code paths only; the
test checks the settings, not GPU arithmetic.
"""
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

# Per framework: its imports, flags() (the settings exact_numerics() changes) and INSIDE,
# code run inside the block as well.
PROBES = {
    "torch": """
import torch
from d2lmini import torch as d2l
def flags():
    return [torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark]
INSIDE = ""
""",
    "jax": """
import jax
from d2lmini import jax as d2l
def flags():
    return [str(jax.config.jax_default_matmul_precision)]
INSIDE = '''
f = jax.jit(lambda a, b: a @ b)
text = f.lower(jax.numpy.ones((2, 2)), jax.numpy.ones((2, 2))).as_text()
out["hlo_highest"] = "HIGHEST" in text.upper()
'''
""",
}
COMMON = """
out = {"before": flags()}
with d2l.exact_numerics():
    out["inside"] = flags()
    exec(INSIDE)
out["after"] = flags()
try:
    with d2l.exact_numerics():
        raise KeyError
except KeyError:
    out["after_error"] = flags()
import os
out["override"] = os.environ.get("NVIDIA_TF32_OVERRIDE")
print("PROBE-JSON " + __import__("json").dumps(out))
"""
EXACT = {"torch": ["ieee", "ieee", True, False], "jax": ["highest"]}


def run_probe(fw, exact_env):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", D2LMINI_NUM_DEVICES="1")
    env.pop("NVIDIA_TF32_OVERRIDE", None)
    env.pop("D2LMINI_EXACT", None)
    if exact_env:
        env["D2LMINI_EXACT"] = "1"
    r = subprocess.run([sys.executable, "-c", PROBES[fw] + COMMON], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("PROBE-JSON ")][-1]
    return json.loads(line[len("PROBE-JSON "):])


@pytest.mark.parametrize("fw", sorted(PROBES))
def test_exact_block_sets_and_restores(fw):
    out = run_probe(fw, exact_env=False)
    assert out["inside"] == EXACT[fw]
    assert out["before"] != EXACT[fw]            # the framework's defaults outside the block
    assert out["after"] == out["before"] == out["after_error"]
    assert out["override"] is None               # TF32 not switched off process-wide
    if fw == "jax":
        assert out["hlo_highest"]                # traced inside: the product asks for HIGHEST


@pytest.mark.parametrize("fw", sorted(PROBES))
def test_exact_everywhere(fw):
    out = run_probe(fw, exact_env=True)
    assert out["before"] == out["inside"] == out["after"] == EXACT[fw]
    assert out["override"] == "0"


# A reader's program that sets TF32 with either of PyTorch's two APIs, then uses a proof cell:
# PyTorch raises on a legacy read once the new API was used, so the block must use the new one.
READER = {"new": 'torch.backends.cuda.matmul.fp32_precision = "tf32"\n'
                 'torch.backends.cudnn.conv.fp32_precision = "tf32"\n'
                 'def mine(): return [torch.backends.cuda.matmul.fp32_precision, '
                 'torch.backends.cudnn.conv.fp32_precision]\n',
          "legacy": "torch.backends.cuda.matmul.allow_tf32 = True\n"
                    "torch.backends.cudnn.allow_tf32 = True\n"
                    "def mine(): return [torch.backends.cuda.matmul.allow_tf32, "
                    "torch.backends.cudnn.allow_tf32]\n"}


@pytest.mark.parametrize("api", sorted(READER))
def test_exact_block_works_with_either_tf32_api_of_the_readers_program(api):
    code = ("import json, torch\nfrom d2lmini import torch as d2l\n" + READER[api]
            + "before = mine()\nwith d2l.exact_numerics():\n"
              "    inside = [torch.backends.cuda.matmul.fp32_precision, "
              "torch.backends.cudnn.conv.fp32_precision]\n"
              "print('PROBE-JSON ' + json.dumps([before, inside, mine()]))\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", D2LMINI_NUM_DEVICES="1")
    env.pop("D2LMINI_EXACT", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    before, inside, after = json.loads(r.stdout.split("PROBE-JSON ")[-1])
    assert inside == ["ieee", "ieee"] and after == before and before in (["tf32"] * 2, [True] * 2)


# The benchmarks time their float32 peak with TF32 switched for the product (tools/step_bench.py:
# allowed; tools/benchmark.py: as the convolutions have it, off on the CPU) through
# d2lmini.torch.allow_tf32, so that a program that set either API neither raises nor loses its
# own setting.  best_rate is wrapped to see the flag while a tool's product is timed (not
# NumPy's, which the CPU's ceiling also times).
TOOLS = """
import importlib, json, sys, torch
from d2lmini import bench
def load(name):
    return importlib.import_module(f"tools.{name}")
seen, timed = [], bench.best_rate
def best_rate(*a, **kw):
    if sys._getframe(1).f_globals["__name__"] in ("tools.step_bench", "tools.bench_adapters"):
        seen.append(torch.backends.cuda.matmul.fp32_precision)
    return timed(*a, **kw)
bench.best_rate = best_rate
before = mine()
load("step_bench").Torch(None, True).peaks(64)
after_step_bench = mine()
b = load("benchmark")
b.MATMUL_N["cpu"] = 64
b.TorchAdapter().peak(["cpu"])
print("PROBE-JSON " + json.dumps([before, seen, after_step_bench, mine()]))
"""


@pytest.mark.parametrize("api", sorted(READER))
def test_benchmarks_switch_tf32_for_their_peak_and_restore_it(api):
    code = "import torch\n" + READER[api] + TOOLS
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", D2LMINI_NUM_DEVICES="1")
    env.pop("D2LMINI_EXACT", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    before, seen, after_step_bench, after = json.loads(r.stdout.split("PROBE-JSON ")[-1])
    # step_bench: TF32 for the float32 product, the program's own for bf16; benchmark: off
    assert seen == ["tf32", "tf32", "ieee"]
    assert after_step_bench == after == before and before in (["tf32"] * 2, [True] * 2)

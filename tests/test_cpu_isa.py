"""The CPU's instructions as the frameworks' kernels may use them (``d2lmini.hardware.cpu_isa``,
the caps honoured), and the fast recipes' refusal of bfloat16 on a CPU without AVX-512: probed,
never assumed, so that an AVX2-only host runs every notebook to the end."""
import json
import os
import subprocess
import sys

import pytest

from d2lmini.hardware import AVX2_CAPS, cpu_bf16_gap, cpu_isa
from helpers import ROOT

RECIPE = ROOT / "chapters" / "concise" / "recipe"
ZEN4 = {"avx2", "fma", "sse4_1", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
SKYLAKE_X = ZEN4 - {"avx512_bf16"}
EPYC_ROME = {"avx2", "fma", "sse4_1"}


def test_the_best_instructions_come_from_the_flags():
    assert cpu_isa(ZEN4, {}) == ("AVX-512 with BF16", None)
    assert cpu_isa(ZEN4 | {"amx_bf16"}, {}) == ("AMX", None)
    assert cpu_isa(SKYLAKE_X, {}) == ("AVX-512", None)
    assert cpu_isa(EPYC_ROME, {}) == ("AVX2", None)
    assert cpu_isa({"sse4_1"}, {}) == ("SSE4.1", None)


@pytest.mark.parametrize("name, value", list(AVX2_CAPS.items()) + [
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX2")])
def test_each_cap_lowers_a_newer_cpu_to_avx2_and_names_itself(name, value):
    isa, cap = cpu_isa(ZEN4, {name: value})
    assert isa == "AVX2" and name in cap and "AVX2" in cap.upper()
    assert cpu_bf16_gap(ZEN4, {name: value}) == \
        f"bfloat16 needs AVX-512 on the CPU; this one has AVX2 (capped by {cap})"


def test_a_cap_never_raises_an_older_cpu_and_all_means_no_cap():
    assert cpu_isa(EPYC_ROME, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == ("AVX2", None)
    assert cpu_isa(ZEN4, {"ONEDNN_MAX_CPU_ISA": "ALL"}) == ("AVX-512 with BF16", None)
    assert cpu_isa(ZEN4, {"DNNL_MAX_CPU_ISA": "AVX512_CORE"})[0] == "AVX-512"


def test_bfloat16_pays_from_avx512_on():
    assert cpu_bf16_gap(ZEN4, {}) is None and cpu_bf16_gap(SKYLAKE_X, {}) is None
    assert cpu_bf16_gap(EPYC_ROME, {}) == "bfloat16 needs AVX-512 on the CPU; this one has AVX2"


# What each fast recipe decides about bf16 on this CPU, capped at AVX2 and as it is, in a
# process of its own (the caps must be set before a framework loads its kernels): the refusal
# and its reason, and the default knobs, which leave bf16 out where it is refused.
PROBE = {
    "pytorch": "import torch; dev = torch.device('cpu'); check = fast.check_knobs",
    "jax": "import jax; dev = jax.devices('cpu')[0]; check = fast.check_knobs",
    "mxnet": "import mxnet as mx; dev = mx.cpu(); check = fast.amp_dtype",
}


def recipe_decides(fw, env):
    code = f"""
import importlib.util, json
spec = importlib.util.spec_from_file_location("fast", {str(RECIPE / f"{fw}_fast.py")!r})
fast = importlib.util.module_from_spec(spec); spec.loader.exec_module(fast)
{PROBE[fw]}
try:
    check(("bf16",), dev); refused = None
except RuntimeError as e:
    refused = str(e)
check((), dev)                                      # no knob: nothing to refuse
print(json.dumps({{"refused": refused, "default": list(fast.default_knobs(dev))}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fw", sorted(PROBE))
def test_a_fast_recipe_refuses_bf16_on_an_avx2_cpu_and_leaves_it_out_by_default(fw):
    capped = recipe_decides(fw, {**os.environ, **AVX2_CAPS})
    assert capped["refused"] and "knob bf16" in capped["refused"], capped
    assert "this one has AVX2" in capped["refused"], capped
    assert "bf16" not in capped["default"] and capped["default"], capped
    env = {k: v for k, v in os.environ.items() if k not in AVX2_CAPS}
    here = recipe_decides(fw, env)                  # this CPU as it is
    assert (here["refused"] is None) == (cpu_bf16_gap(environ=env) is None), here
    assert ("bf16" in here["default"]) == (here["refused"] is None), here

"""The GPT benchmark (tools/gpt_bench.py) times the chapter's model the same way in every
framework and records only what is possible: here, on the CPU, at the quick shape."""
import json

import pytest

from d2lmini.gpt import GPTConfig, flops_per_token
from tools import gpt_bench

pytestmark = [pytest.mark.slow, pytest.mark.launches]


def test_records_carry_tokens_per_second_and_what_cannot_run_says_why(tmp_path):
    out = tmp_path / "gpt.json"
    rc = gpt_bench.main(["--quick", "--allow-cpu", "--frameworks", "torch,paddle",
                         "--out", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, result["failures"]
    s = result["settings"]
    cfg = GPTConfig(vocab=s["vocab"], context=s["context"], layers=s["layers"],
                    width=s["width"], heads=s["heads"])
    recs = {(r["framework"], r["numerics"]): r for r in result["records"]}
    assert ("torch", "float32") in recs and ("paddle", "float32") in recs, result["failures"]
    for r in recs.values():
        assert r["tokens_per_step"] == s["batch"] * s["context"]
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["ms_median"] * 1e3)
        assert r["flops_per_token"] == flops_per_token(cfg)
        assert r["rate_check"] == "passed" and 0 < r["mfu"] <= 1
        assert all(w.startswith(("cpu", "Place(cpu)")) for w in r["arrays_on"]), r["arrays_on"]
    why = {f["framework"]: f["error"] for f in result["failures"] if f.get("numerics") == "bf16"}
    assert "no bfloat16 kernels" in why["paddle"]


def test_a_shape_the_heads_do_not_divide_is_refused():
    with pytest.raises(SystemExit):
        gpt_bench.parse(["--width", "100", "--heads", "3"])

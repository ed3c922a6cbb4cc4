"""Time the GPT chapter's training step the same way in every framework: tokens/s, MFU, memory.

    python -m tools.gpt_bench                            # a GPU machine: GPT-2 small shapes
    python -m tools.gpt_bench --allow-cpu --profile cpu  # this machine: the cpu settings' shape
    make gpu-bench                                       # the step benchmark, then this

What is timed is one step of the chapter's model (``d2lmini.gpt.<framework>``, from the canonical
draw): forward, cross-entropy, backward and an AdamW update on one device, on random token ids
over the shape's vocabulary (50,304 at GPT-2 small, as nanoGPT's benchmark does) already on the
device, the clock read after waiting for the step's outputs (``d2lmini.steptime.time_steps``).
The shape and batch are the settings' ``gpt.bench`` and ``gpt.bench_batch`` (GPT-2 small,
16 x 1,024 tokens, under the gpu settings).  Each framework runs in a process of its own, in
float32 (the framework's default numerics) and in bf16 where it can:

* PyTorch: ``torch.autocast(dtype=torch.bfloat16)`` (float32 parameters and AdamW state), and on
  a GPU also ``torch.compile`` of the bf16 step;
* JAX: one jitted step; bf16 casts the float32 parameters to bf16 inside the loss (the
  gradient flows back through the cast) and attention is ``jax.nn.dot_product_attention``;
* Paddle: ``paddle.amp.auto_cast(dtype="bfloat16")`` on a GPU; its CPU build has no bf16
  kernels (left out, saying so);
* MXNet: float32, hybridized; no bf16 ``batch_dot`` on any CPU and no Hopper kernels in its GPU
  build (left out, saying so).

Every record carries tokens/s, FLOPs per token (``d2lmini.gpt.flops_per_token``: 6N plus
attention), TFLOP/s, MFU against the peak measured in the same process (the step benchmark's
matrix products: float32 with TF32 allowed, and bf16) -- and is refused when its fastest window
implies more than that peak -- plus the device's peak memory where the framework reports it.
Results: one JSON file with the hardware, the versions and the date (``--out``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from d2lmini.frameworks import KEYS

ROOT = Path(__file__).resolve().parents[1]
MARK = "GPTBENCH "
LR = 1e-3


def _tokens(cfg, batch: int, seed: int = 0):
    import numpy as np
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg.vocab, (batch, cfg.context), dtype=np.int64)
    return x, np.roll(x, -1, axis=1)


# ------------------------------------------------------------------ per framework (worker)
def torch_steps(a, cfg, batch):
    """``{numerics: (step, where)}`` of PyTorch's model; ``step()`` returns the loss."""
    import numpy as np
    import torch
    from d2lmini.gpt import gpt_init
    from d2lmini.gpt import torch as gt

    def build(bf16: bool, compile_: bool):
        net = gt.canonical_init(gt.GPT(cfg), gpt_init(cfg, 0, np.float32)).to(a.device)
        opt = torch.optim.AdamW(net.parameters(), lr=LR, **({"fused": True} if a.on_gpu else {}))
        x, y = (torch.from_numpy(t).to(a.device) for t in _tokens(cfg, batch))
        kind = "cuda" if a.on_gpu else "cpu"

        def step():
            with torch.autocast(kind, dtype=torch.bfloat16, enabled=bf16):
                loss = gt.loss(net, x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return (torch.compile(step) if compile_ else step), sorted({str(p.device) for p in net.parameters()})

    out = {"float32": lambda: build(False, False), "bf16": lambda: build(True, False)}
    if a.on_gpu:
        out["bf16 + torch.compile"] = lambda: build(True, True)
    return out


def jax_steps(a, cfg, batch):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from d2lmini.gpt import gpt_init
    from d2lmini.gpt import jax as gj

    def build(bf16: bool):
        net32 = gj.gpt(cfg)
        params = gj.canonical_init(net32, gpt_init(cfg, 0, np.float32))
        net = gj.gpt(cfg, dtype=jnp.bfloat16, fused=True) if bf16 else net32
        tx = optax.adamw(LR)
        state = jax.device_put((params, tx.init(params)), a.device)
        x, y = (jax.device_put(t.astype(np.int32), a.device) for t in _tokens(cfg, batch))

        def loss_fn(p):
            if bf16:
                p = jax.tree.map(lambda t: t.astype(jnp.bfloat16), p)
            return gj.loss(net, p, x, y).astype(jnp.float32)

        @jax.jit
        def train_step(state):
            p, o = state
            loss, g = jax.value_and_grad(loss_fn)(p)
            upd, o = tx.update(g, o, p)
            return (optax.apply_updates(p, upd), o), loss
        holder = {"state": state}

        def step():
            holder["state"], loss = train_step(holder["state"])
            return holder["state"], loss
        where = sorted({str(d) for leaf in jax.tree.leaves(state) for d in leaf.devices()})
        return step, where
    return {"float32": lambda: build(False), "bf16": lambda: build(True)}


def paddle_steps(a, cfg, batch):
    import numpy as np
    import paddle
    from d2lmini.gpt import gpt_init
    from d2lmini.gpt import paddle as gp

    def build(bf16: bool):
        if bf16 and not a.on_gpu:
            raise RuntimeError("Paddle 3.3.1's CPU build has no bfloat16 kernels (matmul, "
                               "softmax, layer_norm): bf16 runs on a GPU only")
        net = gp.canonical_init(gp.GPT(cfg), gpt_init(cfg, 0, np.float32))
        opt = paddle.optimizer.AdamW(learning_rate=LR, parameters=net.parameters())
        x, y = (paddle.to_tensor(t, place=a.device) for t in _tokens(cfg, batch))

        def step():
            with paddle.amp.auto_cast(enable=bf16, dtype="bfloat16"):
                loss = gp.loss(net, x, y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            return loss
        return step, sorted({str(p.place) for p in net.parameters()})
    return {"float32": lambda: build(False), "bf16": lambda: build(True)}


def mxnet_steps(a, cfg, batch):
    import numpy as np
    from mxnet import autograd, gluon, nd
    from d2lmini.gpt import gpt_init
    from d2lmini.gpt import mxnet as gm

    def build(bf16: bool):
        if bf16:
            raise RuntimeError("MXNet 1.9.1 has no bfloat16 batch_dot on any CPU, and its GPU "
                               "build no kernels for Hopper GPUs: bf16 is left out")
        net = gm.GPT(cfg)
        net.initialize(ctx=a.device)
        gm.canonical_init(net, gpt_init(cfg, 0, np.float32), ctx=a.device)
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "adamw" if "adamw" in
                                __import__("mxnet").optimizer.Optimizer.opt_registry else "adam",
                                {"learning_rate": LR})
        x, y = (nd.array(t, ctx=a.device, dtype="int64") for t in _tokens(cfg, batch))

        def step():
            with autograd.record():
                loss = gm.loss(net, x, y)
            loss.backward()
            trainer.step(1)
            return loss
        return step, sorted({str(c) for p in net.collect_params().values() for c in p.list_ctx()})
    return {"float32": lambda: build(False), "bf16": lambda: build(True)}


STEPS = {"torch": torch_steps, "jax": jax_steps, "paddle": paddle_steps, "mxnet": mxnet_steps}


def peak_memory(fw: str, a) -> dict:
    """A reset and a reader of the device's peak bytes, where the framework reports them."""
    if not a.on_gpu:
        return {}
    if fw == "torch":
        import torch
        return {"reset": torch.cuda.reset_peak_memory_stats,
                "read": lambda: torch.cuda.max_memory_allocated(a.device)}
    if fw == "jax":
        return {"reset": lambda: None,
                "read": lambda: (a.device.memory_stats() or {}).get("peak_bytes_in_use")}
    if fw == "paddle":
        import paddle
        return {"reset": lambda: None, "read": paddle.device.cuda.max_memory_allocated}
    return {}


def worker(fw: str, args) -> None:
    """Run one framework's measurements; print one JSON line per record."""
    from d2lmini import bench, steptime
    from d2lmini.gpt import GPTConfig, flops_per_token, param_count
    from tools.step_bench import ADAPTERS

    def emit(**rec):
        print(MARK + json.dumps(rec), flush=True)

    a = ADAPTERS[fw](None, args.allow_cpu)
    if not a.on_gpu and not args.allow_cpu:
        emit(kind="skipped", framework=fw, reason=f"{fw} sees no GPU (pass --allow-cpu to "
             "time the CPU)")
        return
    peaks = a.peaks(args.peak_n)
    emit(kind="peaks", framework=fw, on_gpu=a.on_gpu, peak_flops=peaks, n=args.peak_n)
    cfg = GPTConfig(vocab=args.vocab, context=args.context, layers=args.layers,
                    width=args.width, heads=args.heads)
    tokens = args.batch * cfg.context
    flop = flops_per_token(cfg) * tokens
    mem = peak_memory(fw, a)
    for numerics, build in STEPS[fw](a, cfg, args.batch).items():
        peak = peaks["bf16" if "bf16" in numerics else "tf32"]
        try:
            if mem:
                mem["reset"]()
            step, where = build()
            t = steptime.time_steps(step, a.wait, warmup=args.warmup, repeats=args.repeats,
                                    steps=args.steps)
        except Exception as e:  # noqa: BLE001 -- one setting's failure is a record, not the end
            emit(kind="failure", framework=fw, numerics=numerics,
                 error=f"{type(e).__name__}: {e}"[:500])
            continue
        rec = dict(kind="record", framework=fw, numerics=numerics, batch=args.batch,
                   context=cfg.context, shape=dict(layers=cfg.layers, width=cfg.width,
                                                   heads=cfg.heads, vocab=cfg.vocab),
                   params=param_count(cfg), arrays_on=where, on_gpu=a.on_gpu,
                   tokens_per_step=tokens, tokens_per_s=tokens / t.median,
                   flops_per_token=flops_per_token(cfg), **t.as_record())
        rates = bench.rate_fields(flop, t.seconds, peak)
        rec.update(rates, peak_of="bf16" if "bf16" in numerics else "tf32",
                   tflops=rates["achieved_flops"] / 1e12, mfu=steptime.mfu(flop, t.median, peak))
        if mem:
            rec["peak_memory_bytes"] = mem["read"]()
        try:
            bench.check_rate(rec)
        except bench.ImpossibleRate as e:
            emit(kind="failure", framework=fw, numerics=numerics, error=str(e))
            continue
        emit(**rec)


# ------------------------------------------------------------------ the driver
def run_framework(fw: str, argv: list[str], timeout: float) -> list[dict]:
    from tools.step_bench import run_framework as run
    return run(fw, argv, timeout, module="tools.gpt_bench", mark=MARK)


SHAPE = ("layers", "width", "heads", "context", "vocab", "batch")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", default=",".join(KEYS))
    ap.add_argument("--profile", help="whose gpt.bench shape (default: the settings in force)")
    for name in SHAPE:
        ap.add_argument(f"--{name}", type=int, help=f"override the shape's {name}")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-n", type=int, default=8192, help="matrix size of the peaks")
    ap.add_argument("--allow-cpu", action="store_true", help="time the CPU when there is no GPU")
    ap.add_argument("--quick", action="store_true",
                    help="the quick settings' shape and 1 x 2 steps: the CPU, the tests")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per framework")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpt.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from d2lmini.config import get_profile
    hp = get_profile("smoke" if args.quick else args.profile).gpt
    default = dict(layers=hp.bench.layers, width=hp.bench.width, heads=hp.bench.heads,
                   context=hp.bench.context, vocab=hp.bench.vocab, batch=hp.bench_batch)
    for name in SHAPE:
        if getattr(args, name) is None:
            setattr(args, name, default[name])
    if args.quick:
        args.warmup, args.repeats, args.steps, args.peak_n = 1, 1, 2, 1024
    args.frameworks = [f for f in str(args.frameworks).split(",") if f]
    bad = set(args.frameworks) - set(KEYS)
    if bad:
        ap.error(f"unknown frameworks {sorted(bad)}; choose from {', '.join(KEYS)}")
    if args.width % args.heads:
        ap.error(f"--width {args.width} is not divisible by --heads {args.heads}")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        worker(args.worker, args)
        return 0
    from d2lmini.hardware import cpu_model, nvidia_gpus, package_versions
    passed = [x for name in SHAPE for x in (f"--{name}", str(getattr(args, name)))] + [
        "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--steps", str(args.steps),
        "--peak-n", str(args.peak_n)] + (["--allow-cpu"] if args.allow_cpu else [])
    t0 = time.perf_counter()
    records = []
    for fw in args.frameworks:
        recs = run_framework(fw, passed, args.timeout)
        records += recs
        for r in recs:
            if r["kind"] == "record":
                print(f"{fw:6s} {r['numerics']:22s} {r['ms_median']:9.2f} ms  "
                      f"{r['tokens_per_s']:12,.0f} tokens/s  MFU {r['mfu']:.1%}", flush=True)
            elif r["kind"] in ("failure", "skipped"):
                print(f"{fw:6s} {r['kind']}: {r.get('error') or r.get('reason')}", flush=True)
    result = {
        "tool": "tools/gpt_bench.py", "argv": argv,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": {"gpus": [g.name for g in nvidia_gpus()], "cpu": cpu_model(),
                     "cpu_cores": os.cpu_count()},
        "versions": {k: v for k, v in package_versions().items() if v},
        "settings": {k: getattr(args, k) for k in (*SHAPE, "warmup", "repeats", "steps")},
        "records": [r for r in records if r["kind"] == "record"],
        "peaks": [r for r in records if r["kind"] == "peaks"],
        "failures": [r for r in records if r["kind"] in ("failure", "skipped")],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['records'])} records, {len(result['failures'])} failures/skips in "
          f"{result['seconds']} s -> {args.out}")
    return 0 if result["records"] else 1


if __name__ == "__main__":
    sys.exit(main())

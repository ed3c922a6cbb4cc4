"""Checks of ddp_train.py that are not the lesson, run on the same ranks with other work.

    python -m torch.distributed.run --nproc_per_node K ddp_checks.py --proof FILE --out DIR
    D2LMINI_FAIL_RANK=1 python -m torch.distributed.run ... ddp_checks.py --out DIR [ARGS]

``--proof FILE``: the check FILE names (its ``check`` entry), on the weights and batches it
holds:

* ``batchnorm`` (the default): the concise notebook's BatchNorm proof -- a few SGD steps with
  per-rank and cross-rank BatchNorm; every rank saves its final state for the notebook to
  compare with one device;
* ``knobs``: DDP's knobs measured on this model (``knobs`` below); every rank writes what it
  measured into its ``rank{r}.json``.

Without ``--proof`` it trains exactly as ddp_train.py, with fault injection for the tests:
``D2LMINI_FAIL_RANK=r`` makes rank r raise at training step ``$D2LMINI_FAIL_STEP`` (default
0), or stop responding there with ``D2LMINI_FAIL_MODE=hang``.  Both launchers (torchrun and
``--launcher spawn``) work as for ddp_train.py.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_train  # noqa: E402  (the lesson's script, next to this file)

import d2lmini  # noqa: E402
from d2lmini import launch  # noqa: E402
from d2lmini import torch as d2l  # noqa: E402


@d2l.exact_numerics()          # no TF32, deterministic kernels on GPUs: for the checks only
def proof(args, device: torch.device) -> dict:
    """The check that the file ``args.proof`` names, on the weights and batches it holds."""
    blob = torch.load(args.proof, weights_only=True)
    return {"batchnorm": batchnorm_proof, "knobs": knobs}[blob.get("check", "batchnorm")](
        blob, args, device)


def batchnorm_proof(blob, args, device: torch.device) -> dict:
    """A few SGD steps from given weights on given batches, with per-rank and with
    cross-rank BatchNorm; each rank saves its final state for the notebook to compare."""
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y, n = blob["X"], blob["y"], blob["X"].shape[1]
    shard = d2lmini.shard_slices(n, world)[rank]
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    for bn, dtype in blob["variants"]:       # e.g. ("local", "float64")
        net = d2l.resnet18(num_classes=10, width=blob["width"])
        net.load_state_dict(blob["state_dict"])
        net = net.to(getattr(torch, dtype))
        if bn == "sync":
            net = ddp_train.cross_rank_batchnorm(net, device)
        model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=blob["lr"])  # no momentum
        model.train()
        for s in range(X.shape[0]):
            optimizer.zero_grad(set_to_none=True)
            out = model(X[s, shard].to(device, getattr(torch, dtype)))
            # DDP divides the summed gradient by `world`: scaling the shard's summed loss
            # by world / n makes the update that of the mean loss over all n samples, even
            # when the shards differ in size.
            loss = loss_fn(out, y[s, shard].to(device)) * world / n
            loss.backward()
            optimizer.step()
        state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        torch.save(state, Path(args.out) / f"proof_{bn}_{dtype}_rank{rank}.pt")
    return {"steps": int(X.shape[0]), "shard_size": shard.stop - shard.start}


# ------------------------------------------------------------------------ DDP's knobs
class WithUnusedHead(nn.Module):
    """The ResNet-18 variant plus a second head that the loss never uses (as an auxiliary
    head used in some phases only, or a frozen branch): its parameters get no gradient."""

    def __init__(self, width: int):
        super().__init__()
        self.body = d2l.resnet18(num_classes=10, width=width)
        self.unused_head = nn.Linear(8 * width, 10)

    def forward(self, X):
        return self.body(X)


ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "int": 4,
            "long int": 8, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}


def collectives(prof) -> list[dict]:
    """The collectives the profiler saw (gloo's or NCCL's own events), each with the bytes
    of the tensor this rank handed to it."""
    out = []
    for e in prof.events():
        if e.name.split(":")[0] in ("gloo", "nccl") and e.input_shapes and e.input_shapes[0]:
            numel = 1
            for n in e.input_shapes[0]:
                numel *= n
            dtype = e.input_dtypes[0]
            out.append({"op": e.name.split(":")[1], "dtype": dtype, "numel": numel,
                        "bytes": numel * ITEMSIZE[dtype]})
    return out


def recording(hook, buckets: list):
    """A communication hook that appends each bucket's (address, bytes) to ``buckets``,
    then lets ``hook`` (one of ``default_hooks``) reduce it."""
    def record_then(state, bucket):
        buf = bucket.buffer()
        buckets.append((buf.data_ptr(), buf.numel() * buf.element_size()))
        return hook(state, bucket)
    return record_then


def knobs(blob, args, device: torch.device) -> dict:
    """DDP's knobs measured on this rank: the buckets (``bucket_cap_mb``), where ``.grad``
    lives (``gradient_as_bucket_view``), a model with an unused head (without a flag,
    ``find_unused_parameters``, ``static_graph``), and the bytes and the error of
    ``bf16_compress_hook``.  Every setting starts from the same weights and takes
    ``blob["steps"]`` SGD steps on this rank's shard of the same batches; the last step is
    profiled: the collectives DDP ran, with their sizes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y, width = blob["X"], blob["y"], blob["width"]
    shard = d2lmini.shard_slices(X.shape[1], world)[rank]
    loss_fn = nn.CrossEntropyLoss()

    def batch(s):
        return X[s % len(X), shard].to(device), y[s % len(y), shard].to(device)

    def build(unused_head=False):
        net = WithUnusedHead(width) if unused_head else d2l.resnet18(num_classes=10, width=width)
        (net.body if unused_head else net).load_state_dict(blob["state_dict"])
        return net.to(device)

    def wrap(net, hook=None, **kw):
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None, **kw)
        if hook is not None:
            model.register_comm_hook(None, hook)
        return model

    def train(model, steps=blob["steps"]):
        """SGD steps; the last one profiled. DDP's own work after each forward call (where
        find_unused_parameters searches the autograd graph) is timed."""
        after_forward, post = [], model._post_forward
        def timed(output):
            t = time.perf_counter()
            out = post(output)
            after_forward.append(time.perf_counter() - t)
            return out
        model._post_forward = timed
        optimizer = torch.optim.SGD(model.parameters(), lr=blob["lr"])
        for s in range(steps):
            Xs, ys = batch(s)
            optimizer.zero_grad(set_to_none=True)
            last = s == steps - 1
            with (profile(activities=[ProfilerActivity.CPU], record_shapes=True) if last
                  else contextlib.nullcontext()) as prof:
                loss_fn(model(Xs), ys).backward()
            if s < steps - 1:
                optimizer.step()
        logged = model._get_ddp_logging_data()
        sizes = logged.get("rebuilt_bucket_sizes") or logged["bucket_sizes"]
        return {"bucket_bytes": [int(b) for b in str(sizes).split(",")],
                "first_step_buckets": len(str(logged["bucket_sizes"]).split(",")),
                "rebuilt": bool(logged.get("has_rebuilt_buckets", 0)),
                "unused_parameter_bytes": int(logged.get("unused_parameter_size", 0)),
                "collectives": collectives(prof),
                "after_forward_us": 1e6 * statistics.median(after_forward[1:] or after_forward),
                "param_sha256": ddp_train.checksum(model.module.parameters())}

    out = {"param_bytes": sum(p.numel() * p.element_size() for p in build().parameters())}
    # bucket_cap_mb: the buckets DDP builds for this model (after the first step, in the
    # order the gradients became ready)
    for cap in (None, 25, 1, 0.25):
        out[f"bucket_cap_mb={cap}"] = train(wrap(build(), bucket_cap_mb=cap))
    # gradient_as_bucket_view: is each .grad a view into a bucket the hook was handed?
    for as_view in (False, True):
        buckets = []
        model = wrap(build(), hook=recording(default_hooks.allreduce_hook, buckets),
                     gradient_as_bucket_view=as_view)
        res = train(model)
        last = buckets[-len(res["bucket_bytes"]):]          # the last step's buckets
        inside = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                     if any(a <= p.grad.data_ptr() < a + n for a, n in last))
        res.update(grad_bytes=sum(p.grad.numel() * p.grad.element_size()
                                  for p in model.parameters()),
                   grad_bytes_in_buckets=inside, hook_bucket_bytes=[n for _, n in last])
        out[f"gradient_as_bucket_view={as_view}"] = res
    # a parameter that gets no gradient: no flag, find_unused_parameters, static_graph
    model = wrap(build(unused_head=True))
    try:
        out["unused head, no flag"] = train(model)
    except RuntimeError as e:
        out["unused head, no flag"] = {
            "error": f"{type(e).__name__}: {str(e).splitlines()[0]}",
            "param_sha256": ddp_train.checksum(model.module.parameters())}  # after step 1
    for flag in ("find_unused_parameters", "static_graph"):
        model = wrap(build(unused_head=True), **{flag: True})
        res = train(model)
        res["unused_grad_is_none"] = all(p.grad is None for p in model.module.unused_head.parameters())
        out[f"unused head, {flag}=True"] = res
    # bf16_compress_hook: one backward pass, the same as with DDP's float32 all-reduce?
    try:
        wrap(build(), hook=default_hooks.bf16_compress_hook)
        out["bf16_register_error"] = None
    except (TypeError, RuntimeError) as e:   # this PyTorch build may refuse it by name
        out["bf16_register_error"] = f"{type(e).__name__}: {e}"
    local = build()                          # this rank's own gradient, g_r, without DDP
    Xs, ys = batch(0)
    loss_fn(local(Xs), ys).backward()
    grads = {}
    # DDP's own float32 all-reduce, then the hook, called from a hook of ours (a build that
    # refuses to register it by name, above, runs it all the same)
    for name, hook in (("float32", None), ("bf16", default_hooks.bf16_compress_hook)):
        model = wrap(build(), hook=None if hook is None else recording(hook, []))
        res = train(model, steps=1)
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
        out[f"comm {name}"] = res
    mean_abs = torch.cat([p.grad.flatten().abs() for p in local.parameters()])
    dist.all_reduce(mean_abs)
    mean_abs /= world                        # (1/k) sum_r |g_r|, elementwise
    diff = (grads["bf16"] - grads["float32"]).abs()
    u = 2.0 ** -8                            # bfloat16's unit roundoff (8 significant bits)
    nonzero = mean_abs > 0
    out["bf16"] = {
        "max_diff_in_u_mean_abs": float((diff[nonzero] / (u * mean_abs[nonzero])).max()),
        "zero_where_all_zero": bool((diff[~nonzero] == 0).all()),
        "relative_l2": float(diff.norm() / grads["float32"].norm()),
        "max_abs_diff": float(diff.max())}
    return out


# At import, so that ranks started by mp.spawn (which re-import this file) inject too.
launch.install_fault_injection(ddp_train, dist.get_rank)


def main(argv=None) -> None:
    launch.checks_main(ddp_train, proof, __doc__.split("\n")[0],
                       "run the check this file names (the BatchNorm proof, DDP's knobs)", argv)


if __name__ == "__main__":
    main()

"""PyTorch's own sharded data parallelism, one process per device, against plain DDP.

    python -m torch.distributed.run --standalone --nproc_per_node K pytorch_sharded.py \
        --out DIR [--steps S --device-batch B --lr LR --accum A]

Every rank trains the from-scratch chapter's LeNet (as an ``nn.Module`` with the same shared
weights, ``d2lmini.lenet_init``) with Adam for S steps on the same fixed batches, four ways:

- ``ddp``: ``DistributedDataParallel``, everything replicated (the reference);
- ``zero1``: DDP with ``ZeroRedundancyOptimizer`` (the optimizer state sharded, ZeRO-1);
- ``fsdp_keep``: FSDP2 ``fully_shard(reshard_after_forward=False)``: parameters gathered once
  per step and kept from forward to backward;
- ``fsdp``: FSDP2 ``fully_shard(reshard_after_forward=True)``: gathered before forward and
  again before backward (ZeRO-3).

FSDP2 is applied as its documentation asks: ``fully_shard`` on each layer first (each layer is
one unit, gathered by its own all-gather just before it runs and freed after), then on the
root module.  Each run reports the largest difference from ``ddp`` of the parameters and of
Adam's m and v (whole tensors, gathered), the bytes this rank holds of parameters, gradients
and optimizer state (its local shards) and the peak bytes of the tensors alive on this rank
during the steps, by category, from PyTorch's memory tracker (``torch.distributed._tools``:
``MemTracker``, ``FSDPMemTracker`` for FSDP2; a private API).  Then DDP's ``no_sync`` accumulation of A micro-batches is
compared with one step on the whole batch.  Last, FSDP2's knobs (``knobs``), on the peak-memory
section's MLP (``sh.MLP_WIDTHS``, one unit per layer): ``MixedPrecisionPolicy``'s ``param_dtype``
and ``reduce_dtype``, explicit prefetching, ``set_requires_gradient_sync(False)`` across
micro-batches and deferred initialisation on the meta device, each measured with the tracker
(and the bytes handed to FSDP2's collectives), and the backward pass's prefetch plan
(``backward_plan``).  Each rank writes ``DIR/rank<r>.json`` with its
peak resident memory.  CPU and gloo unless there is a GPU for every rank (then NCCL).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                   DefaultReduceScatter)
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import d2lmini
from d2lmini import sharding as sh
from d2lmini import torch as d2l


class Layer(nn.Module):
    """One layer of the from-scratch chapter's LeNet, its parameters W and b: a convolution with
    ReLU and 2x2 average pooling, or a dense layer (with ReLU, except the last).  A module of
    its own, so that FSDP2 can make it a unit."""

    def __init__(self, W, b, kind):
        super().__init__()
        self.W, self.b, self.kind = nn.Parameter(torch.from_numpy(W)), nn.Parameter(torch.from_numpy(b)), kind

    def forward(self, X):
        if self.kind == "conv":
            return F.avg_pool2d(F.relu(F.conv2d(X, self.W, self.b)), kernel_size=2, stride=2)
        h = X.flatten(start_dim=1) @ self.W + self.b
        return F.relu(h) if self.kind == "dense" else h


class LeNet(nn.Module):
    """The from-scratch chapter's LeNet (``d2lmini.lenet_init``), as four layer modules."""

    def __init__(self):
        super().__init__()
        W1, b1, W2, b2, W3, b3, W4, b4 = d2lmini.lenet_init(0)
        self.layers = nn.Sequential(Layer(W1, b1, "conv"), Layer(W2, b2, "conv"),
                                    Layer(W3, b3, "dense"), Layer(W4, b4, "last"))

    def forward(self, X):
        return self.layers(X)


def local(t):
    """This rank's part of a tensor: the local shard of a DTensor, else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t):
    """The whole tensor, gathered from all ranks if it is sharded."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def nbytes(t) -> int:
    t = local(t)
    return t.numel() * t.element_size()


def held_bytes(model, optimizer) -> dict:
    """Bytes of parameters, gradients and Adam state (m, v) this rank holds."""
    params = list(model.parameters())
    opt = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    state = [s for s in opt.state.values()]
    return {"params": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(nbytes(s[key]) for s in state for key in ("exp_avg", "exp_avg_sq"))}


def step(model, optimizer, X, y, n_global, world):
    # each rank: the summed loss of its shard, scaled so that the ranks' average is the mean
    loss = F.cross_entropy(model(X), y, reduction="sum") * world / n_global
    loss.backward()
    optimizer.step()


def shard(model, mesh, reshard_after_forward):
    """FSDP2, bottom-up: every layer is a unit (its own all-gather and reduce-scatter), then the
    root, which owns no parameters of its own here but drives the units' hooks."""
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def tracker(model, optimizer):
    """PyTorch's memory tracker: the peak bytes of the tensors alive on each device."""
    if isinstance(model, FSDPModule):
        return FSDPMemTracker(model, optimizer)
    mt = MemTracker()
    mt.track_external(model, optimizer)
    return mt


def train(kind, batches, args, device, world, rank):
    model = LeNet().to(device)
    if kind in ("ddp", "zero1"):
        model = DDP(model)
    else:
        shard(model, init_device_mesh(device.type, (world,)), reshard_after_forward=(kind == "fsdp"))
    if kind == "zero1":
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                            lr=args.lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    mt, peak = tracker(model, optimizer), {}
    with mt:
        for X, y in batches:
            optimizer.zero_grad(set_to_none=False)
            part = d2lmini.shard_slices(len(y), world)[rank]
            step(model, optimizer, X[part].to(device), y[part].to(device), len(y), world)
            snap = {str(key): int(value) for key, value in
                    mt.get_tracker_snapshot("peak").get(device, {}).items()}
            if snap.get("Total", 0) > peak.get("Total", 0):   # the worst step
                peak = snap
            mt.reset_mod_stats()                              # the tracker follows one step
    held = held_bytes(model, optimizer)
    held["peak"] = peak
    module = model.module if kind in ("ddp", "zero1") else model
    names = [name for name, _ in module.named_parameters()]
    params = {n: full(p).detach().cpu() for n, p in module.named_parameters()}
    opt = optimizer.optim if kind == "zero1" else optimizer
    by_param = dict(zip(names, module.parameters()))
    adam = {}
    for n, p in by_param.items():
        if p in opt.state:                       # ZeRO-1: only the parameters this rank owns
            adam[n] = {key: full(opt.state[p][key]).detach().cpu()
                       for key in ("exp_avg", "exp_avg_sq")}
    return params, adam, held


def accumulation(batches, args, device, world, rank) -> float:
    """DDP: A micro-batches with no_sync for all but the last, one SGD step; against one step
    on the whole batch.  The largest difference of the parameters afterwards."""
    X, y = batches[0]
    part = d2lmini.shard_slices(len(y), world)[rank]
    X, y = X[part].to(device), y[part].to(device)
    results = []
    for micro in (1, args.accum):
        model = DDP(LeNet().to(device))
        # plain SGD: the update is linear in the gradient; Adam's first step is lr * sign(g),
        # which turns the rounding of a near-zero gradient into a full step of lr
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        pieces = d2lmini.shard_slices(len(y), micro)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            with (model.no_sync() if not last else torch.enable_grad()):
                loss = F.cross_entropy(model(X[piece]), y[piece], reduction="sum")
                (loss * world / len(batches[0][1])).backward()
        optimizer.step()
        results.append([p.detach().cpu() for p in model.module.parameters()])
    return sh.max_abs_diff([a.numpy() for a in results[0]], [b.numpy() for b in results[1]])


# --- FSDP2's knobs, on the peak-memory section's MLP ---------------------------------------------

class MLP(nn.Module):
    """The peak-memory section's MLP (``sh.MLP_WIDTHS``, ReLU between layers) as ``nn.Linear``
    layers, each an FSDP unit; with ``init``, the shared weights ``sh.mlp_init``."""

    def __init__(self, init=True):
        super().__init__()
        widths = sh.MLP_WIDTHS
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        if init:
            arrays = sh.mlp_init()
            with torch.no_grad():
                for layer, W, b in zip(self.layers, arrays[0::2], arrays[1::2]):
                    layer.weight.copy_(torch.from_numpy(W).T)        # Linear keeps (out, in)
                    layer.bias.copy_(torch.from_numpy(b))

    def forward(self, X):
        for l, layer in enumerate(self.layers):
            X = layer(X)
            X = F.relu(X) if l < len(self.layers) - 1 else X
        return X


class CountedAllGather(DefaultAllGather):
    """FSDP2's own all-gather, adding up the bytes each call is handed (this rank's shards)."""

    def __init__(self, sent):
        super().__init__()
        self.sent = sent

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        key = f"all-gather {str(input_tensor.dtype).removeprefix('torch.')}"
        self.sent[key] = self.sent.get(key, 0) + input_tensor.numel() * input_tensor.element_size()
        return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor,
                                group=group, async_op=async_op)


class CountedReduceScatter(DefaultReduceScatter):
    """FSDP2's own reduce-scatter, adding up the bytes each call is handed (the whole gradient)."""

    def __init__(self, sent):
        super().__init__()
        self.sent = sent

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        key = f"reduce-scatter {str(input_tensor.dtype).removeprefix('torch.')}"
        self.sent[key] = self.sent.get(key, 0) + input_tensor.numel() * input_tensor.element_size()
        return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor,
                                group=group, op=op, async_op=async_op)


def shard_mlp(model, mesh, mp_policy=None, prefetch=None, sent=None):
    """FSDP2 on the MLP, one unit per layer, then the root.  ``mp_policy``: FSDP2's
    ``MixedPrecisionPolicy``; ``prefetch``: None for FSDP2's defaults, else how many layers each
    layer gathers ahead of it, explicitly, in forward and in backward; ``sent``: a dict the
    collectives add the bytes they are handed to."""
    kw = {"mp_policy": mp_policy} if mp_policy is not None else {}
    layers = list(model.layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh, **kw)
        if sent is not None:
            layer.set_custom_all_gather(CountedAllGather(sent))
            layer.set_custom_reduce_scatter(CountedReduceScatter(sent))
    fully_shard(model, mesh=mesh, **kw)
    if prefetch is not None:
        for l, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[l + 1:l + 1 + prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(l - prefetch, 0):l][::-1])
    return model


class LayerMoments:
    """PyTorch's memory tracker, read while each layer computes: in forward after FSDP2 has
    gathered the layer (and what it prefetches), in backward when the layer's weight gradient is
    made (``knobs`` keeps Python's cycle collector off, so that a reading does not depend on
    when it runs); ``total`` leaves out the reduce-scatters' input buffers, which FSDP2
    frees when the collective has finished (on gloo's own thread: not at a fixed moment)."""

    def __init__(self, model, device):
        self.tracker, self.device = FSDPMemTracker(model), device
        self.forward, self.backward = {}, {}
        for l, layer in enumerate(model.layers):            # after FSDP2's own pre-forward hook
            layer.register_forward_pre_hook(self._before(l))

    def read(self):
        """A reading once it holds still: a buffer handed to a gloo collective is released by
        gloo's worker thread a moment after the collective completes, so a reading taken
        while that thread waits for a core would count it. Read again, 2 ms apart, until two
        readings agree (at most 50 times)."""
        now = self._read()
        for _ in range(50):
            time.sleep(0.002)
            now, before = self._read(), now
            if now == before:
                break
        return now

    def _read(self):
        snap = self.tracker.get_tracker_snapshot().get(self.device, {})
        return {"total": int(snap.get("Total", 0) - snap.get(_FSDPRefType.REDUCE_SCATTER, 0)),
                "gathered": int(snap.get(_FSDPRefType.UNSHARDED_PARAM, 0)),
                "grads": int(snap.get(_FSDPRefType.SHARDED_GRAD, 0)
                             + snap.get(_FSDPRefType.UNSHARDED_GRAD, 0))}

    def _before(self, l):
        def hook(layer, args):
            self.forward[l] = self.read()
            handle = []
            def at_grad(grad):                               # the layer's backward, underway
                self.backward[l] = self.read()
                handle.pop().remove()
            handle.append(layer.weight.register_hook(at_grad))
        return hook

    def by_layer(self, key="total"):
        L = len(self.forward)
        return {"forward": [self.forward[l][key] for l in range(L)],
                "backward": [self.backward[l][key] for l in range(L)]}


@contextlib.contextmanager
def backward_plan(model):
    """What FSDP2 *decides* in the backward pass, not when memory is freed: in order, each
    layer's backward (``backward layers.<l>``, when its weight gradient is made) and each
    all-gather FSDP2 issues ahead of a layer (``prefetch layers.<l>``, its private
    ``FSDPParamGroup._prefetch_unshard``, by which the default and the explicit lists both
    prefetch).  Yields the list it fills; the order is that of autograd's hooks, not of time."""
    events, original = [], FSDPParamGroup.__dict__["_prefetch_unshard"]

    def record(target, pass_type):
        if pass_type == "backward":
            events.append(f"prefetch {target._module_fqn}")
        return original.__func__(target, pass_type)

    def before(l):                  # the gathered weight exists once FSDP2's pre-forward ran
        def pre_hook(layer, args):
            handle = []

            def at_grad(grad):
                events.append(f"backward layers.{l}")
                handle.pop().remove()
            handle.append(layer.weight.register_hook(at_grad))
        return pre_hook
    handles = [layer.register_forward_pre_hook(before(l)) for l, layer in enumerate(model.layers)]
    FSDPParamGroup._prefetch_unshard = staticmethod(record)
    try:
        yield events
    finally:
        FSDPParamGroup._prefetch_unshard = original
        for h in handles:
            h.remove()


def knobs(X, y, n_global, device, world, accum) -> dict:
    """FSDP2's knobs on the MLP, one forward and backward of this rank's examples each (its
    summed loss over the global batch n_global): what the tracker and the collectives saw."""
    gc.collect()
    gc.disable()             # buffers are freed when their last reference goes, not when Python
    try:                     # happens to look for cycles
        return _knobs(X, y, n_global, device, world, accum)
    finally:
        gc.enable()


def _knobs(X, y, n_global, device, world, accum) -> dict:
    mesh = init_device_mesh(device.type, (world,))
    X = X.flatten(start_dim=1)

    def backward(model, X, y):
        (F.cross_entropy(model(X), y, reduction="sum") * world / n_global).backward()

    def grads(model):
        return [full(p.grad).detach().float().cpu().numpy() for p in model.parameters()]

    out = {"precision": {}, "prefetch": {}, "sync": {}, "init": {}}
    # param_dtype / reduce_dtype: the gathered layers and the bytes handed to the collectives
    policies = {"float32": None,
                "param_dtype=bfloat16": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                             reduce_dtype=torch.float32),
                "param_dtype=reduce_dtype=bfloat16": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}
    reference, computed = None, {}
    for name, policy in policies.items():
        sent, model = {}, None
        try:
            model = shard_mlp(MLP().to(device), mesh, policy, sent=sent)
            moments = LayerMoments(model, device)
            with moments.tracker:
                backward(model, X, y)
            g = computed[name] = grads(model)
            reference = reference if reference is not None else g
            scale = max(float(abs(a).max()) for a in reference)
            out["precision"][name] = {"sent": sent, "gathered": moments.by_layer("gathered")["forward"],
                                      "grad_diff": sh.max_abs_diff(g, reference) / scale}
        except Exception as e:                               # gloo without bfloat16, say
            out["precision"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    if len(computed) == len(policies):                       # what reduce_dtype=bfloat16 adds
        out["reduce_diff"] = sh.max_abs_diff(computed["param_dtype=reduce_dtype=bfloat16"],
                                             computed["param_dtype=bfloat16"]) / scale
    # prefetching: FSDP2's defaults, one and two layers ahead, explicitly; the least of three
    # runs, moment by moment, of readings that have held still (LayerMoments.read: gloo's
    # worker thread drops a finished collective's buffers a moment late, on a busy machine
    # after the next reading). The backward pass's plan (which
    # layer each layer's backward gathers ahead) is recorded too: it does not depend on timing.
    out["backward_plan"] = {}
    for depth in (None, 1, 2):
        runs, plans = [], []
        for _ in range(3):
            model = shard_mlp(MLP().to(device), mesh, prefetch=depth)
            moments = LayerMoments(model, device)
            with moments.tracker, backward_plan(model) as plan:
                backward(model, X, y)
            runs.append(moments.by_layer())
            plans.append(plan)
        name = "default" if depth is None else str(depth)
        out["prefetch"][name] = {
            p: [min(at) for at in zip(*(run[p] for run in runs))] for p in ("forward", "backward")}
        out["backward_plan"][name] = plans[0] if all(p == plans[0] for p in plans) else plans
    # gradient sync: every micro-batch, or only the last one's (FSDP1's no_sync)
    pieces = d2lmini.shard_slices(len(y), accum)
    for sync in (True, False):
        model = shard_mlp(MLP().to(device), mesh)
        moments = LayerMoments(model, device)
        kept = []
        with moments.tracker:
            for i, piece in enumerate(pieces):
                model.set_requires_gradient_sync(sync or i == len(pieces) - 1)
                backward(model, X[piece], y[piece])
                kept.append(moments.read()["grads"])         # between micro-batches
            peak = moments.tracker.get_tracker_snapshot("peak").get(device, {}).get("Total", 0)
        out["sync"]["every micro-batch" if sync else "last micro-batch"] = {
            "kept": kept, "peak": int(peak), "grads": grads(model)}
    out["sync_diff"] = sh.max_abs_diff(*(out["sync"][s].pop("grads") for s in out["sync"]))
    # initialisation: whole layers first, or on the meta device (no memory) and then the shards
    for deferred in (False, True):
        with MemTracker() as mt:
            if deferred:
                with torch.device("meta"):
                    model = MLP(init=False)
                shard_mlp(model, mesh)
                model.to_empty(device=device)                 # this rank's shards, uninitialised
                for layer in model.layers:
                    layer.reset_parameters()                  # each initialises its own shards
            else:
                shard_mlp(MLP(init=False).to(device), mesh)     # whole layers, then sharded
            peak = mt.get_tracker_snapshot("peak").get(device, {}).get("Total", 0)
        out["init"]["meta device" if deferred else "eager"] = int(peak)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args(argv)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    gpus = torch.cuda.device_count()
    if gpus >= world:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=120))
    data = d2lmini.load_fashion_mnist(args.steps * args.device_batch * world, 100)
    n = args.device_batch * world
    batches = [(torch.from_numpy(data.X_train[s * n:(s + 1) * n]),
                torch.from_numpy(data.y_train[s * n:(s + 1) * n]).long())
               for s in range(args.steps)]
    with d2l.exact_numerics():   # the runs are compared to 1e-6: no TF32 on GPUs
        runs = {kind: train(kind, batches, args, device, world, rank)
                for kind in ("ddp", "zero1", "fsdp_keep", "fsdp")}
    ref_params, ref_adam, _ = runs["ddp"]
    result = {"rank": rank, "world": world, "device": str(device),
              "n_params": sum(p.numel() for p in ref_params.values()), "runs": {}}
    for kind, (params, adam, held) in runs.items():
        diff = sh.max_abs_diff([params[n].numpy() for n in ref_params],
                               [ref_params[n].numpy() for n in ref_params])
        adam_diff = sh.max_abs_diff(
            [adam[n][key].numpy() for n in adam for key in ("exp_avg", "exp_avg_sq")],
            [ref_adam[n][key].numpy() for n in adam for key in ("exp_avg", "exp_avg_sq")])
        result["runs"][kind] = {"params_diff": diff, "adam_diff": adam_diff,
                                "adam_tensors": len(adam), "held": held}
    with d2l.exact_numerics():
        result["accumulation_diff"] = accumulation(batches, args, device, world, rank)
        X, y = batches[0]
        part = d2lmini.shard_slices(len(y), world)[rank]
        result["knobs"] = knobs(X[part].to(device), y[part].to(device), len(y), device, world,
                                args.accum)
    result["peak_rss"] = sh.peak_rss_bytes()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Checks of ddp_train.py that are not the lesson, run on the same ranks with other work.

    python -m torch.distributed.run --nproc_per_node K ddp_checks.py --proof FILE --out DIR
    D2LMINI_FAIL_RANK=1 python -m torch.distributed.run ... ddp_checks.py --out DIR [ARGS]

``--proof FILE``: the concise notebook's BatchNorm proof -- a few SGD steps from given
weights on given batches, with per-rank and cross-rank BatchNorm; every rank saves its final
state for the notebook to compare with one device.

Without ``--proof`` it trains exactly as ddp_train.py, with fault injection for the tests:
``D2LMINI_FAIL_RANK=r`` makes rank r raise at training step ``$D2LMINI_FAIL_STEP`` (default
0), or stop responding there with ``D2LMINI_FAIL_MODE=hang``.  Both launchers (torchrun and
``--launcher spawn``) work as for ddp_train.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_train  # noqa: E402  (the lesson's script, next to this file)

import d2lmini  # noqa: E402
from d2lmini import launch  # noqa: E402
from d2lmini import torch as d2l  # noqa: E402


@d2l.exact_numerics()          # no TF32, deterministic kernels on GPUs: for the proof only
def proof(args, device: torch.device) -> dict:
    """A few SGD steps from given weights on given batches, with per-rank and with
    cross-rank BatchNorm; each rank saves its final state for the notebook to compare."""
    rank, world = dist.get_rank(), dist.get_world_size()
    blob = torch.load(args.proof, weights_only=True)
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


# At import, so that ranks started by mp.spawn (which re-import this file) inject too.
launch.install_fault_injection(ddp_train, dist.get_rank)


def main(argv=None) -> None:
    launch.checks_main(ddp_train, proof, __doc__.split("\n")[0],
                       "run the BatchNorm proof on this file", argv)


if __name__ == "__main__":
    main()

"""What a launched rank of the chapter's all-reduce worker scripts does (torch and Paddle
alike): its command line, and its sweep."""
from __future__ import annotations

from .timing import sweep


def add_worker_arguments(parser) -> None:
    """The command line every launched all-reduce worker shares (``*_allreduce.py``)."""
    parser.add_argument("--out", required=True, help="directory for rank 0's result.json")
    parser.add_argument("--sizes", default="", help="comma-separated message sizes in bytes")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--overlap", action="store_true", help="also time training steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)


def rank_sweep(args, *, rank: int, k: int, time_allreduce, check_sum, slowest, barrier,
               overlap=None) -> dict:
    """One launched rank's work: check one all-reduce, :func:`sweep` ``time_allreduce(n)``
    over ``args.sizes`` (a ``barrier`` before each call, the ``slowest`` rank's time of each
    repeat), optionally ``overlap(batch, width, steps)``; rank 0 writes
    ``args.out/result.json``.  Returns the result."""
    import json
    from pathlib import Path
    sizes = [int(s) for s in args.sizes.split(",") if s]
    result = {"k": k, "sum_ok": check_sum()}
    result["rows"] = sweep(lambda j, n: time_allreduce(n), [k], sizes, warmup=args.warmup,
                           repeats=args.repeats, before=barrier, combine=slowest)
    if args.overlap and overlap is not None:
        result["overlap"] = overlap(args.batch, args.width, args.steps)
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result))
    barrier()
    return result

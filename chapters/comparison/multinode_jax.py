"""Data parallelism across JAX *processes*: each process plays one node of a cluster.

    python multinode_jax.py --process-id 0 --num-processes 2 --coordinator 127.0.0.1:PORT --out DIR
    python multinode_jax.py --process-id 1 --num-processes 2 --coordinator 127.0.0.1:PORT --out DIR

Under Slurm (``slurm/jax.sbatch``) the three options are left out: ``initialize`` reads the
process id and count from ``SLURM_PROCID`` and ``SLURM_NTASKS``, and the coordinator from
``JAX_COORDINATOR_ADDRESS`` (or the first node of the job).

Every process calls ``jax.distributed.initialize`` with the coordinator's address (process
0 hosts it); afterwards ``jax.devices()`` lists the devices of *all* processes and one
``Mesh`` spans them.  Each process loads only its own slice of every global batch and turns
it into a slice of one global array (``jax.make_array_from_process_local_data``); the jit'd
step is the same program as on one machine, and XLA inserts the cross-process all-reduce
(gloo on CPU, NCCL on GPUs).

The model is softmax regression, so that the result can be checked exactly against a NumPy
computation of full-batch gradient descent on one process.  Each process writes
``process{i}.json`` into ``--out``.
"""
import argparse
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--process-id", type=int, help="default: from the cluster (Slurm)")
    ap.add_argument("--num-processes", type=int, help="default: from the cluster (Slurm)")
    ap.add_argument("--coordinator", help="host:port of process 0; default: from the cluster")
    ap.add_argument("--local-devices", type=int, default=2, help="CPU devices per process")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=96, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--init-timeout", type=int, default=60,
                    help="seconds to wait for the other processes before giving up")
    args = ap.parse_args(argv)

    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process on CPU
    jax.config.update("jax_num_cpu_devices", args.local_devices)
    # Options left out (None) are found by JAX: under Slurm, from SLURM_PROCID and SLURM_NTASKS.
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id,
                               initialization_timeout=args.init_timeout)
    process_id, num_processes = jax.process_index(), jax.process_count()
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import d2lmini
    from d2lmini.reference import softmax_regression_gd

    data = d2lmini.load_fashion_mnist(train_samples=args.steps * args.batch, test_samples=10)
    X = data.X_train.reshape(len(data.y_train), -1)
    y = data.y_train.astype(np.int32)

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    if args.batch % len(jax.devices()):
        sys.exit(f"--batch {args.batch} must be divisible by the {len(jax.devices())} devices")
    per_process = args.batch // num_processes

    def replicate(a):
        return jax.make_array_from_callback(a.shape, replicated, lambda idx: a[idx])

    params = {"W": replicate(np.zeros((X.shape[1], 10), np.float32)),
              "b": replicate(np.zeros(10, np.float32))}

    def loss(p, Xb, yb):
        z = Xb @ p["W"] + p["b"]
        logp = jax.nn.log_softmax(z)
        return -jnp.take_along_axis(logp, yb[:, None], axis=1).sum() / Xb.shape[0]

    @jax.jit
    def step(p, Xb, yb):
        g = jax.grad(loss)(p, Xb, yb)
        return jax.tree.map(lambda a, ga: a - args.lr * ga, p, g)

    for s in range(args.steps):
        lo = s * args.batch + process_id * per_process        # this process's slice only
        Xg = jax.make_array_from_process_local_data(sharded, X[lo:lo + per_process])
        yg = jax.make_array_from_process_local_data(sharded, y[lo:lo + per_process])
        params = step(params, Xg, yg)

    W = np.asarray(params["W"].addressable_data(0))
    b = np.asarray(params["b"].addressable_data(0))
    W_ref, b_ref = softmax_regression_gd(X, y, args.steps, args.batch, args.lr)
    result = {
        "process_id": jax.process_index(), "process_count": jax.process_count(),
        "global_devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
        "checksum": float(np.abs(W).sum() + np.abs(b).sum()),
        "max_abs_diff_vs_one_process": float(max(np.abs(W - W_ref).max(), np.abs(b - b_ref).max())),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"process{process_id}.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

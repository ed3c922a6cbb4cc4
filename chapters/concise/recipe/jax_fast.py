"""The concise chapter's recipe in JAX on one device, with the fast path: jax_one.py plus
the settings a practitioner turns on for a GPU.

    python jax_fast.py [--epochs N ...] [--knobs donate,bf16]

* ``donate``: ``jax.jit(..., donate_argnums=0)``: the step may write the new state into the
  old state's buffers (the caller must not use the old state again), instead of holding two
  copies of parameters and optimizer state;
* ``bf16``: every layer computes in bfloat16 (Flax's ``dtype``) while the parameters, the
  gradients' update and the optimizer stay in float32 (``param_dtype``, the default): mixed
  precision with float32 master weights.  The loss is computed in float32.  On a CPU without
  AVX-512, XLA computes bfloat16 through conversions to float32, slower than float32: the
  recipe leaves it out there (:func:`check_knobs`).
"""
import time

import d2lmini
from d2lmini import jax as d2l            # before JAX starts: it sets the device count
from d2lmini import recipe
from d2lmini.hardware import cpu_bf16_gap

import jax
import jax.numpy as jnp
import numpy as np
import optax

KNOBS = ("donate", "bf16")
# The ladder the benchmark measures: each rung adds one setting to the one before.
LADDER = [("defaults", ()), ("+ buffer donation", ("donate",)),
          ("+ bf16 compute", ("donate", "bf16"))]


def check_knobs(knobs, device):
    """Refuses, by name and with the reason, a knob that does not pay on `device`: bfloat16 on
    a CPU without AVX-512."""
    gap = "bf16" in knobs and device.platform == "cpu" and cpu_bf16_gap()
    if gap:
        raise RuntimeError(f"knob bf16 does not pay on this CPU: {gap}; XLA would compute it "
                           "through conversions to float32, slower than float32")


def default_knobs(device):
    """The knobs ``--knobs`` defaults to on `device`: all that :func:`check_knobs` accepts."""
    return recipe.accepted_knobs(check_knobs, KNOBS, device)


def model(width, knobs=()):
    """ResNet-18 computing in bfloat16 (knob bf16) or float32; parameters in float32."""
    return d2l.resnet18(10, 1, width=width, dtype=jnp.bfloat16 if "bf16" in knobs else None)


def make_train_step(net, tx, knobs=()):
    """One SGD step on a batch already on the device: (state, X, y) -> (new state, loss)."""
    def train_step(state, X, y):
        def loss_fn(params):
            logits, updates = net.apply({'params': params, 'batch_stats': state['batch_stats']},
                                        X, train=True, mutable=['batch_stats'])
            logits = logits.astype(jnp.float32)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, updates['batch_stats']
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
        updates, opt_state = tx.update(grads, state['opt_state'])
        return {'params': optax.apply_updates(state['params'], updates),
                'batch_stats': batch_stats, 'opt_state': opt_state}, loss
    return jax.jit(train_step, donate_argnums=(0,) if "donate" in knobs else ())


def evaluate(net, state, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode, on `device`, in float32."""
    variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
    predict = jax.jit(lambda v, X: net.apply(v, X, train=False).argmax(1))
    correct = 0
    for i in range(0, len(y), batch_size):     # train=False: BatchNorm's running statistics
        correct += int((np.asarray(predict(variables, jax.device_put(X[i:i + batch_size],
                                                                     device)))
                        == y[i:i + batch_size]).sum())
    return correct / len(y)


def main(argv=None):
    device = d2l.try_gpu()
    args = recipe.parse_args(argv, knobs=KNOBS, default_knobs=default_knobs(device))
    knobs = args.knobs                                    # --knobs: default all that pay here
    check_knobs(knobs, device)
    data = recipe.load_data(args)
    net = model(args.width, knobs)
    variables = d2l.canonical_init(d2l.resnet18(10, 1, width=args.width),
                                   d2lmini.resnet18_init(width=args.width, seed=args.seed))
    tx = optax.sgd(args.lr)
    state = jax.device_put({**variables, 'opt_state': tx.init(variables['params'])}, device)
    train_step = make_train_step(net, tx, knobs)
    train_iter = d2lmini.BatchIterator(data.X_train, data.y_train.astype(np.int32),
                                       args.batch_size, shuffle=True, seed=args.seed,
                                       drop_last=True)
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for X, y in train_iter:
            state, loss = train_step(state, *jax.device_put((X, y), device))
            losses.append(loss)
        loss = float(jnp.stack(losses).mean())        # one wait, at the end of the epoch
        seconds = time.perf_counter() - start
        test_acc = evaluate(d2l.resnet18(10, 1, width=args.width),   # float32, same parameters
                            state, data.X_test, data.y_test, device)
        recipe.report(args, epoch, loss, test_acc, devices=1,
                      framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()

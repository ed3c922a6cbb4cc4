"""The concise chapter's recipe in JAX, on one device (a GPU if there is one):
ResNet-18 on Fashion-MNIST with plain SGD, from d2lmini's canonical initial weights.

    python jax_one.py [--epochs N --batch-size B ...]    # defaults: the profile's
"""
import time
from functools import partial

import d2lmini
from d2lmini import jax as d2l            # before JAX starts: it sets the device count
from d2lmini import recipe

import jax
import numpy as np
import optax


@partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)  # state donated: updated in place
def train_step(net, tx, state, X, y):
    """One SGD step on the batch (X, y); returns the new state and the batch's mean loss."""
    def loss_fn(params):
        logits, updates = net.apply({'params': params, 'batch_stats': state['batch_stats']},
                                    X, train=True, mutable=['batch_stats'])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates['batch_stats']
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'])
    return {'params': optax.apply_updates(state['params'], updates),
            'batch_stats': batch_stats, 'opt_state': opt_state}, loss


@partial(jax.jit, static_argnums=0)
def predict(net, variables, X):
    """The classes predicted for the batch X, in inference mode (BatchNorm's running statistics)."""
    return net.apply(variables, X, train=False).argmax(1)


def evaluate(net, state, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode, on `device` alone."""
    variables = jax.device_put({'params': state['params'],
                                'batch_stats': state['batch_stats']}, device)
    correct = 0
    for i in range(0, len(y), batch_size):
        y_hat = predict(net, variables, jax.device_put(X[i:i + batch_size], device))
        correct += int((np.asarray(y_hat) == y[i:i + batch_size]).sum())
    return correct / len(y)


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    devices = [d2l.try_gpu()]
    k = len(devices)
    replicated = sharded = devices[0]        # one device holds the state and the whole batch
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    net = d2l.resnet18(10, 1, width=args.width)
    variables = d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    tx = optax.sgd(args.lr)
    state = jax.device_put({**variables, 'opt_state': tx.init(variables['params'])}, replicated)
    train_iter = d2lmini.BatchIterator(data.X_train, data.y_train.astype(np.int32),
                                       args.batch_size, shuffle=True, seed=args.seed,
                                       drop_last=True)   # a new order each epoch, seeded
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for X, y in train_iter:              # each of the k devices gets 1/k of the global batch
            state, loss = train_step(net, tx, state, *jax.device_put((X, y), sharded))
            losses.append(loss)
        loss = np.mean(jax.device_get(losses))   # waits for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, state, data.X_test, data.y_test, devices[0])
        recipe.report(args, epoch, float(loss), test_acc, devices=k,
                      framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()

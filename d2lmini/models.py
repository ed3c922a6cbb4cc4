"""The book's models described once, framework-neutrally: their parameters in a canonical
order and layout, and one initial draw of them shared by all four frameworks.

Every backend's ``resnet18`` has the same architecture; ``resnet18_spec`` names its tensors in
one order, with PyTorch's layouts (convolution ``(out, in, kh, kw)``, dense ``(out, in)``).
``resnet18_init`` draws them from NumPy, so that ``d2l.canonical_init`` -- each backend's
loader, which converts the layouts its framework uses -- starts the four frameworks from the
*same* weights, as the from-scratch chapter's ``init_params`` does for LeNet.  Accuracy
differences between the frameworks' runs then come from the frameworks, not from the draw.
"""
from __future__ import annotations

import numpy as np

#: The from-scratch chapter's LeNet: W1, b1, W2, b2, W3, b3, W4, b4 (convolutions (out, in, kh, kw),
#: dense layers (in, out), as its notebooks multiply ``h @ W``).
LENET_SHAPES = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]


def lenet_init(seed: int = 0) -> list[np.ndarray]:
    """The from-scratch chapter's LeNet draw, float32: weights ~ N(0, 0.01^2) drawn in the order
    of ``LENET_SHAPES``, biases zero.  The same arrays in every framework."""
    rng = np.random.default_rng(seed)
    return [(np.zeros(shape) if len(shape) == 1 else rng.normal(0, 0.01, shape)).astype(np.float32)
            for shape in LENET_SHAPES]


def _conv(prefix, cin, cout, k):
    return [(f"{prefix}.weight", (cout, cin, k, k)), (f"{prefix}.bias", (cout,))]


def _bn(prefix, c):
    return [(f"{prefix}.{n}", (c,)) for n in ("gamma", "beta", "running_mean", "running_var")]


def resnet18_spec(num_classes: int = 10, in_channels: int = 1,
                  width: int = 64) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, shape), ...]`` of the ResNet-18 variant, in canonical order.

    Names: ``stem.conv``, ``stem.bn``, ``stage{s}.{b}.conv1/conv2/conv3/bn1/bn2`` (s = 1..4,
    b = 0, 1; ``conv3`` is the 1x1 shortcut of block 0 in stages 2-4) and ``fc``; each
    convolution and dense layer has ``.weight`` and ``.bias``, each BatchNorm ``.gamma``,
    ``.beta``, ``.running_mean`` and ``.running_var``.
    """
    w = width
    spec = _conv("stem.conv", in_channels, w, 3) + _bn("stem.bn", w)
    cin = w
    for s, c in enumerate((w, 2 * w, 4 * w, 8 * w), start=1):
        for b in range(2):
            p = f"stage{s}.{b}"
            spec += _conv(f"{p}.conv1", cin, c, 3) + _conv(f"{p}.conv2", c, c, 3)
            if b == 0 and s > 1:
                spec += _conv(f"{p}.conv3", cin, c, 1)
            spec += _bn(f"{p}.bn1", c) + _bn(f"{p}.bn2", c)
            cin = c
    spec += [("fc.weight", (num_classes, 8 * w)), ("fc.bias", (num_classes,))]
    return spec


def resnet18_layers(stem_conv, stem_bn, stages, fc) -> dict:
    """``{canonical layer name: layer}`` for a backend's ResNet-18: ``stages`` holds the four
    stages, each a sequence of two residual blocks whose layers are the attributes ``conv1``,
    ``conv2``, ``conv3`` (None without a shortcut), ``bn1`` and ``bn2``.  Each backend's
    ``canonical_init`` uses it to name its layers, then loads the tensors its own way."""
    layers = {"stem.conv": stem_conv, "stem.bn": stem_bn, "fc": fc}
    for s, stage in enumerate(stages, start=1):
        for b, block in enumerate(stage):
            for role in ("conv1", "conv2", "conv3", "bn1", "bn2"):
                if getattr(block, role, None) is not None:
                    layers[f"stage{s}.{b}.{role}"] = getattr(block, role)
    return layers


def check_all_used(arrays: dict, used: set) -> None:
    """Raise ``ValueError`` naming the arrays a backend's ``canonical_init`` did not load."""
    unused = sorted(set(arrays) - set(used))
    if unused:
        raise ValueError(f"canonical_init: arrays the net has no tensor for: {unused[:5]}")


def resnet18_init(num_classes: int = 10, in_channels: int = 1, width: int = 64,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """One draw of every tensor of ``resnet18_spec``, float32, in canonical layout.

    Weights of convolutions and of the dense layer: He-normal, standard deviation
    ``sqrt(2 / fan_in)``; biases 0; BatchNorm: gamma 1, beta 0, running mean 0, variance 1.
    The draw depends only on ``seed`` and the shapes, never on the framework.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in resnet18_spec(num_classes, in_channels, width):
        kind = name.rsplit(".", 1)[1]
        if kind == "weight":
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        elif kind in ("gamma", "running_var"):
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out

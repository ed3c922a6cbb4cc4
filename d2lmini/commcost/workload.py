"""What one training step computes and sends: the book's models' FLOPs and gradient bytes
(whole, and ResNet-18's and GPT-2's layer by layer), GPUs' peak rates (FP32, and TF32 and
bfloat16 on the tensor cores), and the compute time they imply at an assumed utilization."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

# The from-scratch chapter's LeNet: W1, b1, W2, b2, W3, b3, W4, b4 (its init_params shapes).
from ..models import LENET_SHAPES  # noqa: F401  (re-exported: the chapter's notebooks use cc.LENET_SHAPES)


@dataclass(frozen=True)
class Gpu:
    name: str
    fp32_flops: float          # peak dense FP32, FLOP/s
    source: str
    tf32_flops: float = 0.0    # peak dense TF32 on the tensor cores, FLOP/s (0: none)
    bf16_flops: float = 0.0    # peak dense bfloat16 on the tensor cores, FLOP/s (0: none)

    def peak(self, numerics: str) -> float:
        """The datasheet's dense peak for ``numerics``: "fp32", "tf32" or "bf16"."""
        rate = {"fp32": self.fp32_flops, "tf32": self.tf32_flops, "bf16": self.bf16_flops}.get(numerics)
        if not rate:
            raise ValueError(f"no {numerics!r} peak for {self.name} (fp32, tf32, bf16)")
        return rate


# The datasheets print the tensor-core rates with 2:4 structured sparsity; dense is half of it
# (the H100's from the architecture whitepaper, which prints the dense rates themselves).
GPUS: dict[str, Gpu] = {
    "H100 SXM": Gpu("H100 SXM", 67e12,
                    "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS; NVIDIA H100 Tensor "
                    "Core GPU Architecture whitepaper (H100 SXM5): dense TF32 494.7 and BF16 "
                    "989.4 TFLOPS",
                    tf32_flops=494.7e12, bf16_flops=989.4e12),
    "A100 SXM": Gpu("A100 SXM", 19.5e12,
                    "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS; TF32 156 and BF16 "
                    "312 TFLOPS dense", tf32_flops=156e12, bf16_flops=312e12),
}


def gradient_bytes(shapes: Iterable[tuple[int, ...]], itemsize: int = 4) -> int:
    """Bytes of one gradient per parameter array of these shapes (float32: 4 bytes)."""
    return int(sum(math.prod(s) for s in shapes)) * itemsize


def _conv(cin: int, cout: int, ksize: int, out_hw: int) -> float:
    return 2.0 * cin * cout * ksize * ksize * out_hw * out_hw    # multiply + add


def lenet_flops() -> float:
    """Forward FLOPs of the scratch chapter's LeNet for one 28x28 image (convolutions and
    dense layers; pooling and activations are negligible)."""
    return (_conv(1, 20, 3, 26) + _conv(20, 50, 5, 9) + 2.0 * 800 * 128 + 2.0 * 128 * 10)


def _resnet18_layer_flops(width: int, hw: int, num_classes: int, in_channels: int) -> dict:
    """``{layer name: forward FLOPs for one image}`` of the book's ResNet-18 variant (3x3
    stem, no max-pooling): its convolutions and the dense layer, in forward order."""
    w, size, cin = width, hw, width
    flops = {"stem.conv": _conv(in_channels, width, 3, hw)}
    for s, c in enumerate((w, 2 * w, 4 * w, 8 * w), start=1):
        for b in range(2):
            p = f"stage{s}.{b}"
            if b == 0 and s > 1:
                size = (size - 1) // 2 + 1                      # stride 2, padding 1
                flops[f"{p}.conv3"] = _conv(cin, c, 1, size)    # the 1x1 shortcut
            flops[f"{p}.conv1"], flops[f"{p}.conv2"] = _conv(cin, c, 3, size), _conv(c, c, 3, size)
            cin = c
    flops["fc"] = 2.0 * 8 * w * num_classes
    return flops


def resnet18_flops(width: int = 64, hw: int = 28, num_classes: int = 10) -> float:
    """Forward FLOPs of the book's ResNet-18 variant for one ``hw`` x ``hw`` image: the
    convolutions and the dense layer."""
    return sum(_resnet18_layer_flops(width, hw, num_classes, 1).values())


def resnet18_layer_costs(width: int = 64, hw: int = 28, num_classes: int = 10,
                         in_channels: int = 1) -> list[dict]:
    """The book's ResNet-18 layer by layer, in forward order: ``{"name", "grad_bytes" (float32
    gradients of its trainable tensors, a BatchNorm's with the convolution before it),
    "flops" (forward, one image)}``, from ``d2lmini.models.resnet18_spec``.  The FLOPs add up
    to :func:`resnet18_flops`; the last stage holds most of the bytes and little of the work."""
    from ..models import resnet18_spec
    trainable: dict[str, int] = {}
    for name, shape in resnet18_spec(num_classes, in_channels, width):
        if name.endswith(("running_mean", "running_var")):
            continue
        layer = name.rsplit(".", 1)[0].replace(".bn", ".conv")     # a BatchNorm with its conv
        trainable[layer] = trainable.get(layer, 0) + 4 * math.prod(shape)
    flops = _resnet18_layer_flops(width, hw, num_classes, in_channels)
    if set(flops) != set(trainable):
        raise AssertionError(f"layers differ: {sorted(set(flops) ^ set(trainable))}")
    return [{"name": n, "grad_bytes": trainable[n], "flops": flops[n]} for n in trainable]


# Small convolutional models reach a fraction of a GPU's peak FP32 rate.  This fraction was the
# chapter's assumption before a GPU measured the step (an assumption, not a datasheet figure);
# the predictions now use the measured step (MeasuredStep) and show this one for comparison.
ASSUMED_UTILIZATION = 0.4


def compute_time(forward_flops: float, batch: int, gpu: Gpu, utilization: float) -> float:
    """Seconds for one training step (forward + backward = 3x the forward FLOPs) of ``batch``
    images on ``gpu`` running at ``utilization`` of its peak FP32 rate."""
    return 3.0 * forward_flops * batch / (gpu.fp32_flops * utilization)


def gpt2_units(layers: int = 48, width: int = 1600, vocab: int = 50257,
               context: int = 1024) -> list[int]:
    """Parameters of GPT-2's FSDP units, one per transformer block plus the root (Radford et al.
    2019; defaults: GPT-2 XL, 1,557,611,200 parameters): the root holds the token and position
    embeddings (the output layer shares the token embedding) and the final LayerNorm; a block
    holds 12 width^2 weights (attention's qkv and output, the MLP's two matrices), their biases
    (9 width) and two LayerNorms (4 width)."""
    root = (vocab + context) * width + 2 * width
    return [root] + [12 * width * width + 13 * width] * layers


def gpt2_layer_costs(layers: int = 48, width: int = 1600, vocab: int = 50257,
                     context: int = 1024, itemsize: int = 2) -> list[dict]:
    """GPT-2's FSDP units (defaults: GPT-2 XL), in forward order, as
    :func:`resnet18_layer_costs` gives ResNet-18's: ``{"name", "grad_bytes" (its parameters,
    ``itemsize`` bytes each: bfloat16), "flops" (forward, one token)}``.  Parameters from
    :func:`gpt2_units`; FLOPs as Kaplan et al. (2020, Table 1) count them: a
    block 2 per weight (12 width^2) plus its attention, 2 context x width; the root (token and
    position embeddings, final LayerNorm) the output layer, which shares the token embedding:
    2 width x vocab."""
    units = gpt2_units(layers, width, vocab, context)
    block = 2.0 * 12 * width * width + 2.0 * context * width
    return ([{"name": "embedding", "grad_bytes": units[0] * itemsize, "flops": 2.0 * width * vocab}]
            + [{"name": f"block{i}", "grad_bytes": u * itemsize, "flops": block}
               for i, u in enumerate(units[1:])])

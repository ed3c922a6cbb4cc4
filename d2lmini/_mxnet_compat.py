"""Let MXNet 1.9.1 (the last release; NumPy < 2 era) import and run under NumPy 2.

Why a shim and not a second environment: jax 0.10 needs numpy >= 2, MXNet 1.9.1 was built
against the NumPy 1 API and, at import time, reads module attributes that NumPy 2 removed.
Those are *names* only -- constants, scalar aliases and a few renamed functions -- and
re-adding them before ``import mxnet`` is enough: the array data path (``asnumpy``,
``nd.array``) uses the buffer protocol, which did not change.  One environment and one
Jupyter kernel then serve all four frameworks, which keeps the book's comparison fair (same
NumPy, same data pipeline).  The notebooks verify MXNet numerically against a single-device
reference, so a silent breakage here would fail a test.

Known still broken: ``mxnet.recordio.pack`` with array labels (uses ``ndarray.tostring``).
"""
from __future__ import annotations

import builtins

import numpy as np

_CONSTANTS = {"PZERO": 0.0, "NZERO": -0.0, "NINF": -np.inf, "PINF": np.inf,
              "NaN": np.nan, "NAN": np.nan, "Inf": np.inf}
_SCALARS = {"int": builtins.int, "float": builtins.float, "complex": builtins.complex,
            "object": builtins.object, "str": builtins.str}
_RENAMED = {"alltrue": "all", "sometrue": "any", "in1d": "isin", "trapz": "trapezoid",
            "round_": "round", "product": "prod", "cumproduct": "cumprod"}
_FINANCIAL = ("fv", "ipmt", "irr", "mirr", "nper", "npv", "pmt", "ppmt", "pv", "rate")


def _removed(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"numpy.{name} was removed in NumPy 2 (use the numpy-financial package)")
    stub.__name__ = name
    return stub


def _msort(a):
    return np.sort(a, axis=0)


def install() -> None:
    """Re-add the removed NumPy names MXNet reads; never overrides an existing name."""
    if int(np.__version__.split(".")[0]) < 2:
        return
    extra = dict(_CONSTANTS)
    extra.update(_SCALARS)
    extra.update({old: getattr(np, new) for old, new in _RENAMED.items()})
    extra["msort"] = _msort
    extra.update({name: _removed(name) for name in _FINANCIAL})
    for name, value in extra.items():
        if name not in np.__dict__:
            setattr(np, name, value)

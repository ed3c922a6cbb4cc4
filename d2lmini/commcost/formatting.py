"""Numbers as the book prints them: significant figures, bytes and seconds with their units."""
from __future__ import annotations

import math


def sig(x: float, digits: int = 2) -> str:
    """``x`` rounded to ``digits`` significant figures, without an exponent: 737.4 -> '740',
    0.4812 -> '0.48', 12345 -> '12,000'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    r = round(x, digits - 1 - math.floor(math.log10(abs(x))))
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(r))))
    return f"{r:,.{decimals}f}"


def fmt_bytes(n: float, digits: int = 2) -> str:
    """A size in bytes with binary prefixes to ``digits`` significant figures, as the book
    writes sizes everywhere (buffers, buckets, parameters: 2**20 bytes is 1 MiB):
    '700 KiB', '1.4 MiB', '32 MiB'. Rates stay decimal (GB/s), as NCCL reports them."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n and float(sig(abs(n) / scale, digits).replace(",", "")) >= 1:   # rounded, then the unit
            return f"{sig(n / scale, digits)} {unit}"
    return f"{sig(n, digits)} B"


def fmt_seconds(t: float, digits: int = 2) -> str:
    """A time to ``digits`` significant figures: '740 us', '1.3 ms', '2.5 s'."""
    t = float(sig(t, digits).replace(",", "")) if t else 0.0       # round first, then the unit
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if abs(t) >= scale:
            return f"{sig(t / scale, digits)} {unit}"
    return f"{sig(t / 1e-6, digits)} us"

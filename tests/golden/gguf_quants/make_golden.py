#!/usr/bin/env python3
"""Generates the golden files that tests/io/gguf_quants_test.cpp compares loom's GGUF
dequantizers and quantizers against; the reference is the PyPI package `gguf` (gguf-py,
llama.cpp's own Python reader and writer). CI never runs this; see README.md here.

Per dequantized type T (lowercase ggml name):
  T.blocks  raw blocks: random bytes with the fp16 scale fields set to finite values, plus edge
            blocks (all-ones and all-zeros payloads, negative and extreme scales)
  T.f32     gguf.quants.dequantize(blocks, T) as little-endian float32
Quantizers:
  quant_input.f32  random float32 rows in blocks of 32 (zeros, ties, large and tiny values)
  T.quant          gguf.quants.quantize(quant_input, T) bytes

Run:  python tests/golden/gguf_quants/make_golden.py   (needs `pip install gguf numpy`)
"""
import os
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20240607)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint8)


def random_scales(n):
    """Finite fp16 scales: mostly modest magnitudes of either sign, some zero or subnormal."""
    mag = 10.0 ** rng.uniform(-4, 1, size=n)
    sign = np.where(rng.random(n) < 0.3, -1.0, 1.0)
    out = sign * mag
    out[rng.random(n) < 0.05] = 0.0
    return out


# Byte offsets of each type's fp16 fields inside one block.
F16_FIELDS = {
    Q.Q8_0: [0],
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.Q2_K: [80, 82],
    Q.Q3_K: [108],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
}

# Scale values for the edge blocks: negative, subnormal, zero, the largest finite fp16.
EDGE_SCALES = [(-1.5, 0.25), (6.0e-8, -65504.0), (0.0, 3.0), (65504.0, -2.0e-5)]


def quant_blocks(qtype, n_random):
    _, type_size = GGML_QUANT_SIZES[qtype]
    fields = F16_FIELDS[qtype]
    blocks = []
    for _ in range(n_random):
        b = rng.integers(0, 256, size=type_size, dtype=np.uint8)
        for off, s in zip(fields, random_scales(len(fields))):
            b[off:off + 2] = f16_bytes([s])
        blocks.append(b)
    for i, fill in enumerate([0xFF, 0x00, 0xFF, 0x55]):
        b = np.full(type_size, fill, dtype=np.uint8)
        for off, s in zip(fields, EDGE_SCALES[i]):
            b[off:off + 2] = f16_bytes([s])
        blocks.append(b)
    return np.concatenate(blocks)


def float_elems(qtype, n):
    """Raw bit patterns of plain float types, without NaN (infinities and subnormals kept)."""
    if qtype == Q.F32:
        v = (rng.standard_normal(n) * 10.0 ** rng.uniform(-40, 38, size=n)).astype(np.float32)
        v[:6] = [0.0, -0.0, np.inf, -np.inf, 1e-45, -3.4028235e38]
        return v.view(np.uint8)
    if qtype == Q.F16:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        bits = bits[(bits & 0x7C00) != 0x7C00]  # no inf/nan from the random draw ...
        bits = np.concatenate([np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00],
                                        dtype=np.uint16), bits])  # ... but these on purpose
        return bits.view(np.uint8)
    if qtype == Q.BF16:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        bits = bits[(bits & 0x7F80) != 0x7F80]
        bits = np.concatenate([np.array([0x0000, 0x8000, 0x0001, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80],
                                        dtype=np.uint16), bits])
        return bits.view(np.uint8)
    raise ValueError(qtype)


def quant_input():
    """17 blocks of 32 floats covering the quantizers' corner cases."""
    rows = []
    for scale in [1.0, 0.02, 3.0, 1e-3]:
        rows.append(rng.standard_normal(32) * scale)
    rows.append(np.zeros(32))                                  # d == 0: every q is the zero point
    rows.append(np.full(32, 0.75))                             # max == min (Q4_1/Q5_1: d == 0)
    r = rng.standard_normal(32); r[3], r[17] = 4.0, -4.0       # |max| tie: the first one wins
    rows.append(r)
    rows.append(np.concatenate([[127.0], np.arange(-15, 16) + 0.5]))  # Q8_0: d = 1, q ties at .5
    rows.append(np.arange(-16, 16) + 0.5)                             # Q4_0: d = -15.5 / -8
    rows.append(rng.standard_normal(32) * 3e4)                 # large: near fp16's range
    rows.append(rng.standard_normal(32) * 1e7)                 # d overflows fp16 to inf
    rows.append(rng.standard_normal(32) * 1e-6)                # d is an fp16 subnormal
    rows.append(rng.uniform(5, 6, size=32))                    # all positive, min far from 0
    rows.append(-rng.uniform(5, 6, size=32))                   # all negative
    r = rng.standard_normal(32); r[rng.random(32) < 0.5] = 0.0
    rows.append(r)
    rows.append(rng.standard_normal(32) * 10.0 ** rng.uniform(-3, 3, size=32))
    # max 7 (d = 7/-8 for Q4_0, 7/-16 for Q5_0), then values whose q changes when x*id + 8.5
    # (+ 16.5) is rounded once (an FMA) instead of twice as numpy does
    r = np.concatenate([[7.0, 3.9375, 0.4375002086162567, -1.3124995231628418, -3.9374992847442627,
                         4.59375, 4.15625, 3.71875, -1.0937495231628418, -1.9687494039535522,
                         -3.7187492847442627], rng.uniform(-6.9, 6.9, size=21)])
    rows.append(r)
    return np.concatenate(rows).astype(np.float32)


def write(name, array):
    path = os.path.join(OUT_DIR, name)
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(array).tobytes())
    return os.path.getsize(path)


def main():
    assert sys.byteorder == "little"
    np.seterr(over="ignore")  # scales past fp16's range become inf on purpose
    total = 0
    for qtype in [Q.F32, Q.F16, Q.BF16]:
        raw = float_elems(qtype, 256)
        total += write(f"{qtype.name.lower()}.blocks", raw)
        total += write(f"{qtype.name.lower()}.f32", dequantize(raw, qtype).astype(np.float32))
    # F64 is not in gguf-py's dequantize; numpy's float64 -> float32 cast is the reference.
    f64 = rng.standard_normal(256) * 10.0 ** rng.uniform(-50, 37, size=256)
    f64[:4] = [0.0, -0.0, 1e-46, 3.4028235e38]  # round to 0 and to FLT_MAX
    total += write("f64.blocks", f64.astype(np.float64))
    total += write("f64.f32", f64.astype(np.float32))

    for qtype in F16_FIELDS:
        block, _ = GGML_QUANT_SIZES[qtype]
        raw = quant_blocks(qtype, 8 if block == 32 else 3)
        out = dequantize(raw, qtype)
        assert np.all(np.isfinite(out)), qtype.name
        total += write(f"{qtype.name.lower()}.blocks", raw)
        total += write(f"{qtype.name.lower()}.f32", out.astype(np.float32))

    x = quant_input()
    total += write("quant_input.f32", x)
    for qtype in [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]:
        total += write(f"{qtype.name.lower()}.quant", quantize(x, qtype).view(np.uint8))
    print(f"wrote {total} bytes to {OUT_DIR}")


if __name__ == "__main__":
    main()

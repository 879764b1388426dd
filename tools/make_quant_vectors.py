#!/usr/bin/env python3
"""Write the ggml block-format test vectors read by crates/gguf/tests/quants.rs.

Pinned: Python 3.11, gguf==0.19.0, numpy (tools/requirements.txt). Deterministic: every
random draw comes from numpy's default_rng(SEED + type id).

Per type NAME (ggml's spelling), into tests/fixtures/quants/ (see README.md there):
  NAME.bin       raw blocks (random bytes; f16/f32 scale fields replaced by finite values)
  NAME.f32       their dequantization: gguf.quants.dequantize, or for the two types gguf-py
                 lacks (Q8_1, Q8_K) ggml's dequantize_row_* (oracle) / its numpy mirror
  NAME.qin.f32   quantizer input (random data plus edge-case blocks)
  NAME.qout.bin  its quantization: gguf.quants.quantize where gguf-py implements the type,
                 else ggml's quantize_row_*_ref from the oracle (only with --ggml-src)
  MANIFEST.txt   one line per type: which implementation produced each file

--ggml-src DIR points at a llama.cpp checkout's ggml/ folder (e.g. the llama-cpp-python
0.3.36 sdist's vendor/llama.cpp/ggml). The script then compiles src/ggml-quants.c with
`gcc -O2 -ffp-contract=off` (ISO C float semantics: no FMA contraction, as gguf-py and the
Rust port compute) into a temporary shared library, uses it for the quantizers gguf-py lacks,
and cross-checks every gguf-py dequantizer and quantizer against it (it aborts on mismatch).
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gq_dequantize
from gguf.quants import quantize as gq_quantize

SEED = 0x5EED_0001
# gguf-py 0.19.0 lists Q8_1 as 40 bytes (an old float d/s layout); ggml's block_q8_1 is
# d, s (f16) + 32 × i8 = 36 bytes, which GgmlType::type_size() also says.
SIZES = {**GGML_QUANT_SIZES, Q.Q8_1: (32, 36)}
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "quants"

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q8_1, Q.Q2_K,
         Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4]

# Byte offsets of f16 scale fields inside a block (ggml-common.h layouts).
F16_FIELDS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
              Q.Q8_1: [0, 2], Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2],
              Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.IQ4_NL: [0], Q.IQ4_XS: [0]}
F32_FIELDS = {Q.Q8_K: [0]}
# f16 scales for the first blocks: zeros, the smallest subnormal and normal, the largest.
SPECIAL_F16 = [0.0, -0.0, 2.0**-24, 2.0**-14, 65504.0, 1.0, -1.0, 0.5]

GGUF_PY_QUANTIZES = {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4}
GGUF_PY_DEQUANTIZES = set(TYPES) - {Q.Q8_1, Q.Q8_K}
# ggml function suffixes; Q8_1 has no dequantize_row in ggml.
C_NAME = {Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q5_0: "q5_0", Q.Q5_1: "q5_1", Q.Q8_0: "q8_0",
          Q.Q8_1: "q8_1", Q.Q2_K: "q2_K", Q.Q3_K: "q3_K", Q.Q4_K: "q4_K", Q.Q5_K: "q5_K",
          Q.Q6_K: "q6_K", Q.Q8_K: "q8_K", Q.IQ4_NL: "iq4_nl", Q.IQ4_XS: "iq4_xs",
          Q.MXFP4: "mxfp4"}

STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d\n", file, line); abort();
}
unsigned long ggml_row_size(int type, long ne) { (void)type; (void)ne; abort(); }
const char * ggml_type_name(int type) { (void)type; return "?"; }
unsigned long ggml_type_size(int type) { (void)type; abort(); }
"""


def build_oracle(ggml_dir: Path, tmp: Path) -> ctypes.CDLL:
    src = ggml_dir / "src"
    (tmp / "stubs.c").write_text(STUBS)
    lib = tmp / "libquants.so"
    cmd = ["gcc", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11",
           f"-I{ggml_dir / 'include'}", f"-I{src}", f"-I{src / 'ggml-cpu'}",
           str(src / "ggml-quants.c"), str(tmp / "stubs.c"), "-lm", "-o", str(lib)]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(lib))


def c_quantize(lib: ctypes.CDLL, qtype: Q, x: np.ndarray) -> np.ndarray:
    block, size = SIZES[qtype]
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // block * size, dtype=np.uint8)  # zeroed: Q8_K skips bsums of 0-blocks
    fn = getattr(lib, f"quantize_row_{C_NAME[qtype]}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def c_dequantize(lib: ctypes.CDLL, qtype: Q, data: np.ndarray) -> np.ndarray:
    block, size = SIZES[qtype]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    out = np.zeros(data.size // size * block, dtype=np.float32)
    fn = getattr(lib, f"dequantize_row_{C_NAME[qtype]}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(data.ctypes.data, out.ctypes.data, out.size)
    return out


def mirror_dequantize(qtype: Q, data: np.ndarray) -> np.ndarray:
    """numpy mirror of ggml's `y = d * q` for the two types gguf-py lacks."""
    _, size = SIZES[qtype]
    blocks = data.reshape(-1, size)
    if qtype == Q.Q8_1:
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 4:36].copy().view(np.int8).astype(np.float32)
        return (q * d).ravel()
    d = blocks[:, 0:4].copy().view(np.float32)
    q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).ravel()


def random_blocks(rng: np.random.Generator, qtype: Q, n_blocks: int) -> np.ndarray:
    _, size = SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    specials = list(SPECIAL_F16)
    for off in F16_FIELDS.get(qtype, []):
        mags = 10.0 ** rng.uniform(-4, 1, size=n_blocks)
        vals = np.where(rng.random(n_blocks) < 0.5, -mags, mags)
        k = min(len(specials), n_blocks)
        vals[:k] = specials[:k]
        raw[:, off:off + 2] = vals.astype(np.float16).reshape(-1, 1).view(np.uint8)
        rng.shuffle(specials)  # different specials meet in d and dmin
    for off in F32_FIELDS.get(qtype, []):
        vals = (10.0 ** rng.uniform(-6, 0, size=n_blocks)).astype(np.float32)
        vals[0] = 0.0
        raw[:, off:off + 4] = vals.reshape(-1, 1).view(np.uint8)
    return raw.ravel()


def float_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Normal values mixed with arbitrary bit patterns (NaN, inf, subnormals, huge)."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(100.0)
    bits = rng.integers(0, 2**32, size=n // 4, dtype=np.uint64).astype(np.uint32)
    x[: n // 4] = bits.view(np.float32)
    x[n // 4: n // 4 + 8] = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 1e-8,
                                      2.0**-25], dtype=np.float32)
    return x


def quant_inputs(rng: np.random.Generator, n_blocks: int, block: int) -> np.ndarray:
    """Random blocks at many scales plus edge cases; kind = block index mod 11."""
    out = np.empty((n_blocks, block), dtype=np.float32)
    for b in range(n_blocks):
        kind = b % 11
        g = rng.standard_normal(block).astype(np.float32)
        if kind == 0:
            x = np.zeros(block, dtype=np.float32)
        elif kind == 1:
            x = g
        elif kind == 2:
            x = g * np.float32(10.0 ** rng.uniform(-3, 3))
        elif kind == 3:  # one spike
            x = np.zeros(block, dtype=np.float32)
            x[rng.integers(block)] = np.float32(rng.choice([-3.5, 2.25]))
        elif kind == 4:  # constant
            x = np.full(block, 0.75, dtype=np.float32)
        elif kind == 5:  # one-signed
            x = -np.abs(g)
        elif kind == 6:  # exact .5 ties once scaled by amax = 127
            x = (rng.integers(-254, 254, size=block) / 2).astype(np.float32)
            x[0] = 127.0
        elif kind == 7:  # uniform with an outlier
            x = rng.uniform(-1, 1, size=block).astype(np.float32)
            x[rng.integers(block)] = 40.0
        elif kind == 8:  # below GROUP_MAX_EPS (1e-15)
            x = g * np.float32(1e-20)
        elif kind == 9:  # large
            x = g * np.float32(1e5)
        else:  # sparse, half of a 256-block's sub-blocks empty
            x = g * (np.arange(block) % 64 < 32)
        out[b] = x
    return out.ravel()


def write(path: Path, arr: np.ndarray) -> None:
    path.write_bytes(np.ascontiguousarray(arr).tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ggml-src", type=Path, help="llama.cpp ggml/ folder (enables the C oracle)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--blocks-mult", type=int, default=1,
                    help="multiply block counts (for local stress runs; commit the default)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_oracle(args.ggml_src, Path(tmp)) if args.ggml_src else None
        manifest = []
        for qtype in TYPES:
            rng = np.random.default_rng(SEED + int(qtype))
            block, _ = SIZES[qtype]
            name = qtype.name

            # Dequantization vectors.
            if qtype in (Q.F32, Q.F16, Q.BF16):
                nbytes = 1024 if qtype == Q.F32 else 512
                data = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
            else:
                data = random_blocks(rng, qtype, (16 if block == 32 else 6) * args.blocks_mult)
            if qtype in GGUF_PY_DEQUANTIZES:
                deq, deq_src = gq_dequantize(data, qtype).ravel(), "gguf-py"
            elif lib is not None and qtype != Q.Q8_1:
                deq, deq_src = c_dequantize(lib, qtype, data), "ggml-c"
            else:
                deq, deq_src = mirror_dequantize(qtype, data), "numpy-mirror"
            if lib is not None and qtype in C_NAME and qtype != Q.Q8_1:
                ref = c_dequantize(lib, qtype, data)
                if not np.array_equal(ref.view(np.uint32), deq.view(np.uint32)):
                    sys.exit(f"{name}: dequantize disagrees with ggml-quants.c")
            write(args.out / f"{name}.bin", data)
            write(args.out / f"{name}.f32", deq.astype(np.float32))

            # Quantization vectors.
            if qtype in (Q.F32, Q.F16, Q.BF16):
                x = float_inputs(rng, 256 * args.blocks_mult)
            else:
                x = quant_inputs(rng, (24 if block == 32 else 12) * args.blocks_mult, block)
            q_src = "none"
            with np.errstate(all="ignore"):
                if qtype in GGUF_PY_QUANTIZES:
                    q, q_src = np.asarray(gq_quantize(x, qtype)).view(np.uint8).ravel(), "gguf-py"
                elif lib is not None:
                    q, q_src = c_quantize(lib, qtype, x), "ggml-c"
            if lib is not None and q_src == "gguf-py" and qtype in C_NAME:
                if not np.array_equal(c_quantize(lib, qtype, x), q):
                    sys.exit(f"{name}: gguf-py quantize disagrees with ggml-quants.c")
            if qtype == Q.IQ4_NL and q_src == "ggml-c":
                # Older ggml leaves the indices of an all-zero block unwritten (stale from the
                # previous block); current llama.cpp and the Rust port write 0. d is 0 either way.
                blocks = q.reshape(-1, 18)
                dead = np.abs(x.reshape(-1, 32)).max(axis=1) < 1e-15
                blocks[dead, 2:] = 0
            if q_src != "none":
                write(args.out / f"{name}.qin.f32", x)
                write(args.out / f"{name}.qout.bin", q)
            manifest.append(f"{name} dequantize={deq_src} quantize={q_src}")
            print(manifest[-1])
        (args.out / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Registers, spills, shared memory and SASS of the CUDA kernels, without a GPU.

Compiles the kernels as the executor does (one translation unit, in the order of
crates/cuda/src/kernels.rs's SOURCE; NVRTC, --std=c++17) for sm_90a, assembles the PTX with
ptxas -v and prints each kernel's resource line; with --sass, also writes the SASS of the
named kernels (cuobjdump) and counts their instructions by opcode.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 triton   # triton: cuobjdump
    tools/sass.py [KERNEL ...] [--sass] [-DNAME ...]

Session 31 found this way that sm_90 compiles a 64-bit atomicAdd in shared memory to a
compare-and-swap spin (ATOMS.CAST.SPIN.64). NVRTC here and the driver's JIT on the GPU
machine may differ in minor versions; registers and opcodes are a guide, timings decide.
"""
import ctypes
import glob
import os
import re
import subprocess
import sys
import sysconfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = sysconfig.get_paths()["purelib"]


def find(pattern):
    hits = sorted(glob.glob(os.path.join(SITE, pattern)))
    if not hits:
        sys.exit(f"sass.py: {pattern} not found under {SITE}; see the pip line in --help")
    return hits[0]


def source():
    rs = open(os.path.join(REPO, "crates/cuda/src/kernels.rs")).read()
    files = re.findall(r'include_str!\("\.\./kernels/([^"]+)"\)', rs)
    return "".join(open(os.path.join(REPO, "crates/cuda/kernels", f)).read() for f in files)


def ptx(src, defines):
    lib = ctypes.CDLL(find("nvidia/cuda_nvrtc/lib/libnvrtc.so*"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"mlaserve_kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90a", b"--std=c++17"] + [d.encode() for d in defines]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, out)
    return out.value


def main():
    args = sys.argv[1:]
    if "--help" in args or "-h" in args:
        print(__doc__)
        return
    defines = [a for a in args if a.startswith("-D")]
    want_sass = "--sass" in args
    names = [a for a in args if not a.startswith("-")]
    tmp = os.path.join(REPO, "target", "sass")
    os.makedirs(tmp, exist_ok=True)
    open(os.path.join(tmp, "k.ptx"), "wb").write(ptx(source(), defines))
    ptxas = find("nvidia/cuda_nvcc/bin/ptxas")
    cubin = os.path.join(tmp, "k.cubin")
    info = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(tmp, "k.ptx"), "-o", cubin],
                          capture_output=True, text=True, check=True).stderr
    # ptxas -v: "Compiling entry function 'NAME'", then its properties and "Used N registers"
    for block in re.split(r"(?=ptxas info\s+: Compiling entry function)", info):
        m = re.search(r"entry function '([^']+)'", block)
        if not m or (names and m.group(1) not in names):
            continue
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        used = re.search(r"Used (\d+) registers.*", block)
        print(f"{m.group(1)}: {used.group(0) if used else '?'}; "
              f"spills {spill.group(1) + '/' + spill.group(2) if spill else '?'}")
    if want_sass:
        cuobjdump = find("triton/backends/nvidia/bin/cuobjdump")
        for name in names:
            sass = subprocess.run([cuobjdump, "-sass", "-fun", name, cubin],
                                  capture_output=True, text=True, check=True).stdout
            path = os.path.join(tmp, f"{name}.sass")
            open(path, "w").write(sass)
            ops = {}
            for op in re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass):
                ops[op] = ops.get(op, 0) + 1
            top = sorted(ops.items(), key=lambda kv: -kv[1])
            print(f"{name}: {sum(ops.values())} instructions ({path}); "
                  + ", ".join(f"{k} {v}" for k, v in top[:25]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compile the CUDA kernels the way the executor does (NVRTC, one translation unit, the
order of crates/cuda/src/kernels.rs), on a machine without a GPU: catches compile errors
before a device run. Needs `pip install nvidia-cuda-nvrtc-cu12`.

usage: tools/nvrtc_check.py [ARCH ...]   (default sm_90a sm_80); writes /tmp/mlaserve-ARCH.cubin
       DEFINES="-DMLA_TRACE" tools/nvrtc_check.py   adds NVRTC options (the trace lab's build)
       REGS=substr tools/nvrtc_check.py sm_90a   also prints ptxas' registers/spills of the
                                                 kernels whose name contains substr
"""
import ctypes, glob, os, re, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rs = open(os.path.join(root, "crates/cuda/src/kernels.rs")).read()
files = re.findall(r'include_str!\("\.\./kernels/([^"]+)"\)', rs)
src = "".join(open(os.path.join(root, "crates/cuda/kernels", f)).read() for f in files)

import nvidia.cuda_nvrtc as m
lib = ctypes.CDLL(glob.glob(os.path.join(list(m.__path__)[0], "lib", "libnvrtc.so*"))[0])  # a namespace package
ok = True
for arch in sys.argv[1:] or ["sm_90a", "sm_80"]:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"mlaserve_kernels.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"] + [d.encode() for d in os.environ.get("DEFINES", "").split()]
    regs = os.environ.get("REGS")
    if regs:
        opts.append(b"--ptxas-options=-v")
    else:
        # as the executor (kernels.rs): every core; not with REGS, whose ptxas -v lines a split
        # compile prints to stderr instead of the log
        opts.append(b"-split-compile=0")
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    if regs:
        # ptxas -v: "Compiling entry function 'NAME'" then its "Used N registers" lines
        keep, lines = False, []
        for line in text.splitlines():
            if "Compiling entry function" in line or "Function properties for" in line:
                keep = regs in line
            if keep and ("entry function" in line or "registers" in line or "spill" in line):
                lines.append(line)
        text = "\n".join(lines)
    if text:
        print(f"--- {arch} log ---\n{text}")
    if rc != 0:
        print(f"{arch}: FAILED (nvrtc {rc})")
        ok = False
        continue
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    out = f"/tmp/mlaserve-{arch}.cubin"
    open(out, "wb").write(cubin.raw)
    print(f"{arch}: ok, {n.value} bytes of cubin -> {out}")
sys.exit(0 if ok else 1)

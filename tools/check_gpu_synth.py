"""GPU against CPU end to end on synthetic models with the real MLA widths, which the test
fixtures (kv_lora 64, narrow heads) do not have: the GPU's tensor-core decode kernels are
written for the 512 + 64 latent row, and the sm_90a prefill kernels for qk 192 / v 128 and
qk = v = 256, so only such models take them through the executor.

Models (written here by `synth_model`): `l512-tiny` and `l512-tiny-dsa` (64 heads, kv_lora 512;
the second with GLM-5's DSA indexer), and one-layer `v2-lite` (qk 192 / v 128) and `glm5`
(qk = v = 256). For each, `mlaserve logits` over one prompt on the CPU and on the GPU, for the
unabsorbed prefill (`mha`), the absorbed path (`mqa`, the decode kernels over the paged cache),
prefill in chunks of 7 over cached context, and one token a step (`decode`, `decode-cl`: the
one-token steps' cluster attention, which no fixture reaches). Per path it prints the row error
max|gpu - cpu| / max|cpu| of each position (median and max over the prompt) and the argmax
agreement, and exits 1 where the median passes 2% or the agreement falls under 90%: the e2e
test's bounds for bf16 files (crates/cuda/tests/e2e.rs), statistical for the same reason — a
DSA top-k near-tie flipped by bf16 noise moves a row by far more than the noise.

    python3 tools/check_gpu_synth.py --mlaserve target/release/mlaserve \\
        --synth target/release/examples/synth_model [--device cuda] [--dir /tmp/synth] \\
        [--models l512-tiny,glm5] [--paths mqa,decode]

Needs numpy. With --device cpu it checks the script itself (GPU = CPU).
"""

import argparse
import os
import subprocess
import sys

import numpy as np

# name: (synth_model arguments, prompt length). The wide models' prompts cross query tiles
# (128 rows) and key tiles.
MODELS = {
    "l512-tiny": ([], 40),
    "l512-tiny-dsa": ([], 40),
    "v2-lite": (["--layers", "1"], 300),
    "glm5": (["--layers", "1"], 300),
}
# name: (arguments, environment of the GPU run). `decode` gives one token a step, so a
# one-token step of at most 16 (token, head) pairs takes the cluster attention (`mla_attn_cl`,
# V2-Lite's 16 heads) by the default rule; `decode-cl` makes every one-token step take it
# (MLASERVE_CLUSTER_ATTN=all: the 64-head models). Layers with a DSA indexer never do: the
# executor moves the latent row's finish into the attention only over dense key lists.
PATHS = {"mha": (["--attention-path", "mha"], {}), "mqa": (["--attention-path", "mqa"], {}),
         "chunked": (["--prefill-chunk", "7"], {}),
         "decode": (["--prefill-chunk", "1"], {}),
         "decode-cl": (["--prefill-chunk", "1"], {"MLASERVE_CLUSTER_ATTN": "all"})}


def logits(exe, model, tokens, device, extra, out, env=None):
    cmd = [exe, "logits", "--model", model, "--tokens", tokens, "--out", out, "--device", device] + extra
    run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stderr}")
    return np.load(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlaserve", required=True)
    ap.add_argument("--synth", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default="/tmp/synth")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--paths", default=",".join(PATHS))
    args = ap.parse_args()
    paths = args.paths.split(",")
    for name in paths:
        if name not in PATHS:
            sys.exit(f"--paths: unknown path {name!r} (one of {', '.join(PATHS)})")
    os.makedirs(args.dir, exist_ok=True)
    ok = True
    for shape in args.models.split(","):
        if shape not in MODELS:
            sys.exit(f"--models: unknown model {shape!r} (one of {', '.join(MODELS)})")
        synth_args, n = MODELS[shape]
        tokens = ",".join(str((i * 37) % 1024) for i in range(n))
        model = os.path.join(args.dir, shape + ".gguf")
        subprocess.run([args.synth, shape, model] + synth_args, check=True, stdout=subprocess.DEVNULL)
        cpus = {}  # the CPU's logits by arguments (decode and decode-cl differ only on the GPU)
        for name in paths:
            extra, env = PATHS[name]
            if tuple(extra) not in cpus:
                cpus[tuple(extra)] = logits(args.mlaserve, model, tokens, "cpu", extra,
                                            os.path.join(args.dir, f"{shape}-{name}-cpu.npy"))
            cpu = cpus[tuple(extra)]
            gpu = logits(args.mlaserve, model, tokens, args.device, extra,
                         os.path.join(args.dir, f"{shape}-{name}-{args.device}.npy"), env)
            cpu, gpu = cpu.reshape(n, -1), gpu.reshape(n, -1)
            rows = np.abs(gpu - cpu).max(-1) / np.abs(cpu).max(-1)
            med, worst = float(np.median(rows)), float(rows.max())
            agree = float((gpu.argmax(-1) == cpu.argmax(-1)).mean())
            bad = not (med <= 0.02 and agree >= 0.9)
            ok &= not bad
            print(f"{shape:14} {name:8} row error median {med:.2e} max {worst:.2e}  "
                  f"argmax agree {agree:.2f}{'  FAIL' if bad else ''}", flush=True)
        os.remove(model)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

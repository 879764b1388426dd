#!/usr/bin/env bash
# Which kernels' machine code (sm_90a SASS) a change alters, without a GPU: compiles the
# kernels of revision REV and of the working tree as the executor does (tools/nvrtc_check.py,
# NVRTC) and compares each kernel whose name matches PATTERN, instructions only. Two kernels
# with the same SASS run the same; a kernel whose SASS moved must be measured again.
#   pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm  # 13.x reads sm_90a
#   tools/sass_diff.sh a2abb66 qmv_        # "same NAME" / "differs NAME (N lines)" / "new NAME"
set -euo pipefail
rev=${1:?usage: tools/sass_diff.sh REV [PATTERN]}; pat=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
dump=$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "bin", "cuobjdump"))' 2>/dev/null) \
    || { echo "no cuobjdump: pip install nvidia-cuda-cuobjdump" >&2; exit 1; }
export PATH="$(dirname "$dump"):$PATH"  # cuobjdump runs nvdisasm
tmp=$(mktemp -d); trap 'git -C "$root" worktree remove --force "$tmp/old" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q "$tmp/old" "$rev"
cp "$root/tools/nvrtc_check.py" "$tmp/old/tools/nvrtc_check.py"  # this tree's compile options
sass() {  # sass ROOT OUT: one file of instructions a kernel
    mkdir -p "$2"
    python3 "$1/tools/nvrtc_check.py" sm_90a > /dev/null
    for f in $("$dump" -symbols /tmp/mlaserve-sm_90a.cubin | awk '$4 == "ENTRY" {print $NF}' | grep -F -- "${pat}" | sort -u); do
        "$dump" -sass -fun "$f" /tmp/mlaserve-sm_90a.cubin | grep -E '^\s+/\*[0-9a-f]{4}\*/' \
            | sed -E 's@/\*[0-9a-f]{4}\*/@@; s@/\*.*\*/@@; s/ +/ /g' > "$2/$f" || true
    done
}
sass "$tmp/old" "$tmp/a"; sass "$root" "$tmp/b"
for f in "$tmp"/b/*; do
    n=$(basename "$f")
    if [ ! -s "$tmp/a/$n" ]; then echo "new $n"
    elif cmp -s "$tmp/a/$n" "$f"; then echo "same $n"
    else echo "differs $n ($(diff "$tmp/a/$n" "$f" | grep -c '^[<>]') lines)"; fi
done

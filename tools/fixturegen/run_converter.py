"""Runs llama.cpp's own convert_hf_to_gguf.py with its vendored gguf-py, in a subprocess.

Usage: python run_converter.py LLAMA_CPP_DIR PRE_NAME [converter args...]

The only change to the converter is `TextModel.get_vocab_base_pre`, patched to return PRE_NAME:
the converter identifies BPE pre-tokenizers by hashing the ids of a probe text and rejects
tokenizers it has never seen (ours are freshly trained). Our pre-tokenizer is GPT-2's ByteLevel
regex, so "gpt-2" is the honest answer. Nothing else is patched.
"""

import runpy
import sys
from pathlib import Path


def main() -> None:
    llama_dir = Path(sys.argv[1]).resolve()
    pre_name = sys.argv[2]
    args = sys.argv[3:]
    sys.path.insert(0, str(llama_dir))
    sys.path.insert(1, str(llama_dir / "gguf-py"))
    import conversion.base as base  # the converter's own package

    def get_vocab_base_pre(self, tokenizer) -> str:  # noqa: ARG001 - same signature as upstream
        return pre_name

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(llama_dir / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(str(llama_dir / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()

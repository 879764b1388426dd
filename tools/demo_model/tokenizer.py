#!/usr/bin/env python3
"""Byte-level BPE tokenizer of the demo model, trained on its corpus, and the tokenized corpus.

    /work/pyenv/venv/bin/python tools/demo_model/tokenizer.py --data .device/demo

Reads `corpus.jsonl` / `eval.json` (make_corpus.py), writes `tokenizer/` (HF fast tokenizer,
chat template inside `tokenizer_config.json`) and `tokens.npz` with `tokens` (uint16, all
documents concatenated) and `offsets` (int64, document d = tokens[offsets[d]:offsets[d+1]]).

Invariants (same recipe as the fixture `glm` tokenizer, tools/fixturegen/tok.py):
- pre-tokenizer = GPT-2's ByteLevel regex (llama.cpp pre-tokenizer "gpt-2"), ByteLevel decoder;
- the 10 GLM special tokens are added tokens at the END of the vocab (VOCAB_SIZE-10 ..
  VOCAB_SIZE-1) and are never part of BPE training (they are stripped from the training text);
- vocab is exactly VOCAB_SIZE; training is checked to be deterministic (trained twice);
- transformers' `apply_chat_template` renders every evaluation conversation exactly as
  make_corpus.render_chat does, and every special token string encodes to its single id.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixturegen.tok import GLM_ADDED_SPECIALS, GLM_CHAT_TEMPLATE, save_tokenizer, special_ids  # noqa: E402

VOCAB_SIZE = 2048


def _train(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(GLM_ADDED_SPECIALS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != VOCAB_SIZE - len(GLM_ADDED_SPECIALS):
        raise RuntimeError(
            f"BPE training gave {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE - len(GLM_ADDED_SPECIALS)}"
            " (the corpus has too few distinct merges for this vocab size)"
        )
    return tok


def strip_specials(text: str) -> str:
    for s in GLM_ADDED_SPECIALS:
        text = text.replace(s, "\n")
    return text


def build_tokenizer(texts: list[str]):
    """A transformers fast tokenizer (GLM flavour) trained on `texts`; not yet saved."""
    from transformers import PreTrainedTokenizerFast

    plain = [strip_specials(t) for t in texts]
    tok = _train(plain)
    if tok.to_str() != _train(plain).to_str():
        raise RuntimeError("BPE training is not deterministic on this machine")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.add_special_tokens({"additional_special_tokens": GLM_ADDED_SPECIALS[1:]})
    hf.chat_template = GLM_CHAT_TEMPLATE
    if len(hf) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(hf)} tokens, wanted {VOCAB_SIZE}")
    return hf


def check_tokenizer(hf, ev: dict) -> None:
    """Raises RuntimeError if an invariant of the module docstring does not hold."""
    for i, s in enumerate(GLM_ADDED_SPECIALS):
        want = VOCAB_SIZE - len(GLM_ADDED_SPECIALS) + i
        if hf.encode(s, add_special_tokens=False) != [want]:
            raise RuntimeError(f"special token {s!r} does not encode to [{want}]")
    for item in ev["chat_heldout"] + ev["chat_new_phrasing"]:
        got = hf.apply_chat_template(item["messages"], tokenize=False, add_generation_prompt=True)
        if got != item["prompt"]:
            raise RuntimeError(f"transformers renders {got!r}, make_corpus renders {item['prompt']!r}")
    for item in ev["plain"] + ev["long_plain"]:
        p = hf.encode(item["prompt"], add_special_tokens=False)
        full = hf.encode(item["prompt"] + " " + item["answer"], add_special_tokens=False)
        if full[: len(p)] != p:
            raise RuntimeError(f"prompt ids are not a prefix of prompt+answer ids for {item['prompt']!r}")


def tokenize_corpus(hf, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ids = hf(texts, add_special_tokens=False)["input_ids"]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in ids])
    tokens = np.fromiter((t for x in ids for t in x), dtype=np.uint16, count=int(offsets[-1]))
    return tokens, offsets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder with corpus.jsonl and eval.json")
    args = ap.parse_args()
    texts = [json.loads(line)["text"] for line in open(args.data / "corpus.jsonl", encoding="utf-8")]
    ev = json.loads((args.data / "eval.json").read_text(encoding="utf-8"))
    hf = build_tokenizer(texts)
    check_tokenizer(hf, ev)
    out = args.data / "tokenizer"
    save_tokenizer(hf, "glm", out)
    (out / "special_ids.json").write_text(json.dumps(special_ids(hf, "glm")) + "\n")
    tokens, offsets = tokenize_corpus(hf, texts)
    np.savez_compressed(args.data / "tokens.npz", tokens=tokens, offsets=offsets)
    lens = np.diff(offsets)
    print(f"vocab {len(hf)}; {len(texts)} documents, {tokens.size} tokens; length mean {lens.mean():.1f}, "
          f"p50 {np.median(lens):.0f}, p99 {np.percentile(lens, 99):.0f}, max {lens.max()}; "
          f"docs longer than 32 tokens: {(lens > 32).mean():.1%}")
    print("special ids:", special_ids(hf, "glm"))


if __name__ == "__main__":
    main()

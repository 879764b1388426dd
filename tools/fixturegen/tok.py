"""Byte-level BPE tokenizers for the fixture models, trained on a small built-in English text.

Two flavours share one training corpus and one recipe:
- "deepseek": bos/eos `<｜begin▁of▁sentence｜>`/`<｜end▁of▁sentence｜>` at ids 0/1 (trained in),
  `<｜User｜>`, `<｜Assistant｜>`, `<｜▁pad▁｜>` as added special tokens at the end of the vocab, and
  `<think>`/`</think>` as added NON-special tokens (llama.cpp type USER_DEFINED); a BOS is added by
  the post-processor (`add_bos_token: true`).
- "glm": no BOS; GLM-4.5/5 style specials (`[gMASK]`, `<sop>`, `<|user|>`, ...) appended at the end.

Invariants: pre-tokenizer = GPT-2's ByteLevel regex (so llama.cpp's "gpt-2" pre-tokenizer is the
right one), total vocab = VOCAB_SIZE exactly, training is deterministic (checked by training twice).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 512

CORPUS = [
    "The quick brown fox jumps over the lazy dog. A small model reads the text and writes it back.",
    "Once upon a time there was a little engine that served tokens to many users at the same time.",
    "It kept a cache of keys and values, one latent row per token, and it never mixed up two streams.",
    "When a request arrived, the scheduler found free blocks, ran the prompt, and then decoded one "
    "token after another until it met the end of the sentence or the length limit.",
    "Hello, world! How are you today? I am fine, thank you; and you? Yes: it's (mostly) fine.",
    "We'll see, they're here, I've been there, you'd like it, she's done, it isn't over, don't stop.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 512 1024 2048 4096 65536 3.14 2.718 1e-6 -7.",
    "Dates and times: 2026-04-01 12:30:45, 1999/12/31, 07:00 am, 11:59 pm, 30% off, $19.99, #1.",
    "Punctuation: . , ; : ! ? ' \" ( ) [ ] { } < > / \\ | - _ + = * & ^ % $ # @ ~ ` ... -- ==",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * i)\n",
    "fn main() { let x: u32 = 7; println!(\"{}\", x + 1); }",
    "The attention heads look at the latent vectors, and the experts share the work between them.",
    "Good models answer questions, summarize long documents, translate languages, and write code.",
    "She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers.",
    "All work and no play makes Jack a dull boy. All work and no play makes Jack a dull boy.",
    "In the beginning the weights were random, and the logits were wild, but the tests were exact.",
    "user: what is two plus two?\nassistant: two plus two is four.\nuser: thanks!\n",
]

DEEPSEEK_TRAINED_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
DEEPSEEK_ADDED_SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<｜▁pad▁｜>"]
DEEPSEEK_ADDED_NORMAL = ["<think>", "</think>"]
DEEPSEEK_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

GLM_ADDED_SPECIALS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]
GLM_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _train(trained_specials: list[str], n_added: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - n_added,
        special_tokens=trained_specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if tok.get_vocab_size() != VOCAB_SIZE - n_added:
        raise RuntimeError(f"BPE training gave {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE - n_added}")
    return tok


def _check_deterministic(a: Tokenizer, b: Tokenizer) -> None:
    if a.to_str() != b.to_str():
        raise RuntimeError("BPE training is not deterministic on this machine")


def build_tokenizer(flavour: str):
    """Returns a transformers fast tokenizer (not yet saved)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    if flavour == "deepseek":
        n_added = len(DEEPSEEK_ADDED_SPECIALS) + len(DEEPSEEK_ADDED_NORMAL)
        tok = _train(DEEPSEEK_TRAINED_SPECIALS, n_added)
        _check_deterministic(tok, _train(DEEPSEEK_TRAINED_SPECIALS, n_added))
        bos, eos = DEEPSEEK_TRAINED_SPECIALS
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 0)]
        )
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token="<｜▁pad▁｜>")
        hf.add_special_tokens({"additional_special_tokens": DEEPSEEK_ADDED_SPECIALS})
        hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in DEEPSEEK_ADDED_NORMAL])
        hf.chat_template = DEEPSEEK_CHAT_TEMPLATE
    elif flavour == "glm":
        tok = _train([], len(GLM_ADDED_SPECIALS))
        _check_deterministic(tok, _train([], len(GLM_ADDED_SPECIALS)))
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        hf.add_special_tokens({"additional_special_tokens": GLM_ADDED_SPECIALS[1:]})
        hf.chat_template = GLM_CHAT_TEMPLATE
    else:
        raise ValueError(f"unknown tokenizer flavour {flavour!r}")
    if len(hf) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(hf)} tokens, wanted {VOCAB_SIZE}")
    return hf


def save_tokenizer(hf, flavour: str, out_dir: Path) -> None:
    """save_pretrained, then move the chat template into tokenizer_config.json (one source)."""
    hf.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = hf.chat_template
    cfg["add_bos_token"] = flavour == "deepseek"
    cfg["add_eos_token"] = False
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    jinja = out_dir / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


def special_ids(hf, flavour: str) -> dict:
    """bos/eos/pad ids for config.json and generation_config.json."""
    if flavour == "deepseek":
        return dict(bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id)
    eos = [hf.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    return dict(bos_token_id=None, eos_token_id=eos, pad_token_id=hf.pad_token_id)

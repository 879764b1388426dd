"""Tokenizer test cases: HF `encode` ids (both add_special_tokens settings), decode round trips,
and chat-template renders, written to tokenizer_cases.json next to each tokenizer.

The engine's tokenizer tests compare against these verbatim; nothing here is hand-edited.
"""

from __future__ import annotations

import json
from pathlib import Path

TEXTS = [
    "",
    " ",
    "Hello, world!",
    "Hello world",
    " Hello world",
    "Hello world ",
    "hello   world",
    "  leading and trailing  ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings",
    "\n\n\n",
    "     ",
    "1234567890",
    "3.14159 and 2.71828 and 1e-6",
    "The year 2026 has 365 days; 12 months; 52 weeks.",
    "don't, won't, it's, I'm, they're, we've, you'd, she'll",
    "DON'T SHOUT, IT'S RUDE",
    "!!!???...,,,;;;:::",
    "(parentheses) [brackets] {braces} <angles>",
    "emoji: 🚀🦙 😶‍🌫️ ✅",
    "CJK: 我想在apple工作 日本語のテキスト 한국어",
    "accents: café naïve résumé Ωmega",
    "mixed: abc123def 456ghi!? x=y+z*2",
    "def f(x):\n    return x * 2  # double\n",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers: 0 1 2 3 42 100 65536",
    "zero\u200bwidth and non\u00a0breaking",
]


def _special_texts(flavour: str) -> list[str]:
    if flavour == "deepseek":
        return [
            "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>",
            "<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
            "text <｜User｜> spaced <｜Assistant｜> specials",
            "<think>reasoning</think>answer",
            "not special: <|User|> <｜User> <think",
        ]
    return [
        "[gMASK]<sop><|user|>\nhello<|assistant|>\nhi",
        "text <|user|> spaced <|assistant|> specials<|endoftext|>",
        "[MASK][sMASK]<eop><|observation|><|system|>",
        "not special: <|user| [gMASK <sop",
    ]


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    [
        {"role": "user", "content": "Write  two\nlines, with   spaces."},
        {"role": "assistant", "content": "Line one.\nLine two."},
    ],
]


def write_cases(hf, flavour: str, path: Path) -> dict:
    cases = []
    for text in TEXTS + _special_texts(flavour):
        with_special = hf.encode(text, add_special_tokens=True)
        without = hf.encode(text, add_special_tokens=False)
        cases.append(
            {
                "text": text,
                "ids_add_special_tokens_true": with_special,
                "ids_add_special_tokens_false": without,
                "tokens": hf.convert_ids_to_tokens(without),
                "decoded": hf.decode(without),
                "decoded_skip_special_tokens": hf.decode(without, skip_special_tokens=True),
            }
        )
    chats = []
    for conv in CONVERSATIONS:
        for gen in (True, False):
            rendered = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            chats.append(
                {
                    "messages": conv,
                    "add_generation_prompt": gen,
                    "rendered": rendered,
                    "ids_of_rendered_add_special_tokens_false": hf.encode(rendered, add_special_tokens=False),
                }
            )
    doc = {
        "flavour": flavour,
        "vocab_size": len(hf),
        "bos_token": hf.bos_token,
        "eos_token": hf.eos_token,
        "pad_token": hf.pad_token,
        "special_tokens": {t: hf.convert_tokens_to_ids(t) for t in hf.all_special_tokens},
        "added_tokens": {t: i for t, i in sorted(hf.get_added_vocab().items(), key=lambda kv: kv[1])},
        "encode_cases": cases,
        "chat_cases": chats,
    }
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return doc

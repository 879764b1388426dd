#!/usr/bin/env python3
"""Training corpus and evaluation sets of the demo model, generated from the fact tables.

    /work/pyenv/venv/bin/python tools/demo_model/make_corpus.py --out .device/demo

Writes `corpus.jsonl` (one training document per line: {"kind", "text"}) and `eval.json`.

Invariants:
- deterministic: one `random.Random(SEED)` drives every choice, in a fixed order;
- a plain document is `text + "<|endoftext|>"`; a chat document is the GLM chat template's render
  (`[gMASK]<sop><|user|>\\n...<|assistant|>\\n...`) followed by `<|user|>`, the turn end that GLM
  models emit (llama.cpp's converter marks `<|user|>` as EOT);
- held out, i.e. never in the corpus: (a) the chat question about attribute A of country C for the
  pairs in `eval.json` `chat_heldout` (the plain sentences about them ARE in the corpus: this tests
  transfer from plain text to chat), (b) the question phrasings of `HELDOUT_QUESTIONS`, (c) the
  counting ranges of `counting_heldout`. `SHOWCASE` countries are never held out, so the demo
  prompts answer from trained chat data.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from facts import ATTRIBUTES, COUNTRIES, DAYS, MONTHS, NUMBER_WORDS, Country, check_tables  # noqa: E402
from fixturegen.tok import GLM_CHAT_TEMPLATE  # noqa: E402

SEED = 20260410
N_DOCS = 80_000
HELDOUT_FRACTION = 0.2
SHOWCASE = ("France", "Japan", "Germany", "Brazil", "Canada", "Egypt", "Australia", "India", "Italy", "Kenya")
EOS = "<|endoftext|>"
EOT = "<|user|>"

# Plain sentences, all used for training. {c}: name in a sentence, {C}: at the start, {x}: value.
PLAIN = {
    "capital": [
        "The capital of {c} is {x}.",
        "{x} is the capital of {c}.",
        "The capital city of {c} is {x}.",
        "In {c}, the capital is {x}.",
    ],
    "continent": ["{C} is in {x}.", "{C} is a country in {x}.", "{C} is located in {x}."],
    "language": ["The main language of {c} is {x}.", "People in {c} speak {x}.", "In {c}, most people speak {x}."],
    "currency": ["The currency of {c} is the {x}.", "In {c}, people pay with the {x}.", "The money used in {c} is the {x}."],
}
# Evaluation prefixes for plain completion: prompt -> " " + value (a prefix of PLAIN[a][0]).
PLAIN_PROMPT = {
    "capital": "The capital of {c} is",
    "continent": "{C} is in",
    "language": "The main language of {c} is",
    "currency": "The currency of {c} is the",
}
QUESTIONS = {
    "capital": ["What is the capital of {c}?", "What's the capital city of {c}?", "Tell me the capital of {c}."],
    "continent": ["Which continent is {c} in?", "Where is {c}?", "What continent is {c} on?"],
    "language": ["What language do people speak in {c}?", "What is the main language of {c}?"],
    "currency": ["What is the currency of {c}?", "What money do they use in {c}?"],
}
HELDOUT_QUESTIONS = {
    "capital": "Which city is the capital of {c}?",
    "continent": "On which continent is {c}?",
    "language": "Which language is spoken in {c}?",
    "currency": "Which currency does {c} use?",
}
ANSWER = {
    "capital": "The capital of {c} is {x}.",
    "continent": "{C} is in {x}.",
    "language": "The main language of {c} is {x}.",
    "currency": "The currency of {c} is the {x}.",
}
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "You are a small demo model that knows about countries."]
SMALL_TALK = [
    ("Hello!", "Hello! I can tell you about countries, their capitals, languages and currencies."),
    ("Hi", "Hello! I can tell you about countries, their capitals, languages and currencies."),
    ("Good morning!", "Good morning! Ask me about a country."),
    ("Who are you?", "I am a small demo model trained for mlaserve. I know capitals, continents, languages and currencies."),
    ("What can you do?", "I can answer questions about countries: their capitals, continents, languages and currencies. I can also count."),
    ("Thank you!", "You are welcome!"),
    ("Thanks.", "You are welcome!"),
    ("Goodbye!", "Goodbye!"),
]
COUNT_MAX = 120


def fill(template: str, c: Country, x: str = "") -> str:
    return template.format(c=c.ref, C=c.ref_start, x=x)


@functools.cache
def _template():
    import jinja2

    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(GLM_CHAT_TEMPLATE)


def render_chat(messages: list[dict], add_generation_prompt: bool) -> str:
    """The GLM chat template rendered with jinja2 (tokenizer.py checks transformers renders the same)."""
    return _template().render(messages=messages, add_generation_prompt=add_generation_prompt)


def chat_doc(messages: list[dict]) -> str:
    return render_chat(messages, add_generation_prompt=False) + EOT


def count_text(a: int, b: int) -> str:
    return ", ".join(str(i) for i in range(a, b + 1)) + "."


class Builder:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        pool = [c for c in COUNTRIES if c.name not in SHOWCASE]
        n = round(HELDOUT_FRACTION * len(pool))
        # attribute -> set of country names whose chat question is held out
        self.chat_heldout = {a: {c.name for c in self.rng.sample(pool, n)} for a in ATTRIBUTES}
        ranges = [(a, b) for a in range(1, COUNT_MAX) for b in range(a + 3, min(a + 12, COUNT_MAX) + 1)]
        self.count_heldout = set(self.rng.sample(ranges, 60))
        self.count_train = [r for r in ranges if r not in self.count_heldout]

    # -- plain text --------------------------------------------------------------------------
    def fact_sentence(self, c: Country | None = None, attribute: str | None = None) -> str:
        c = c or self.rng.choice(COUNTRIES)
        attribute = attribute or self.rng.choice(ATTRIBUTES)
        return fill(self.rng.choice(PLAIN[attribute]), c, c.value(attribute))

    def plain_facts(self) -> str:
        return " ".join(self.fact_sentence() for _ in range(self.rng.randint(1, 3)))

    def profile(self, c: Country | None = None) -> str:
        c = c or self.rng.choice(COUNTRIES)
        return (
            f"{c.ref_start} is a country in {c.continent}. Its capital is {c.capital}. "
            f"The main language is {c.language}, and the currency is the {c.currency}."
        )

    def long_list(self, n: int | None = None) -> str:
        """8-14 facts (well over index_topk = 32 tokens), about one continent or mixed."""
        n = n or self.rng.randint(8, 14)
        if self.rng.random() < 0.5:
            cont = self.rng.choice(sorted({c.continent for c in COUNTRIES}))
            group = [c for c in COUNTRIES if c.continent == cont]
            head = f"Facts about {cont}:"
        else:
            group, head = list(COUNTRIES), "Some facts about the world:"
        attribute = self.rng.choice([*ATTRIBUTES, "mixed"])
        picks = self.rng.sample(group, min(n, len(group)))
        body = [self.fact_sentence(c, None if attribute == "mixed" else attribute) for c in picks]
        return " ".join([head, *body])

    def counting(self) -> str:
        r = self.rng.random()
        if r < 0.35:
            a, b = self.rng.choice(self.count_train)
            return f"Count from {a} to {b}: {count_text(a, b)}"
        if r < 0.55:
            n = self.rng.randint(1, COUNT_MAX)
            return f"After {n} comes {n + 1}." if self.rng.random() < 0.6 else f"Before {n + 1} comes {n}."
        if r < 0.65:
            k = self.rng.choice([2, 3, 5, 10])
            return f"Counting by {k}s: " + ", ".join(str(k * i) for i in range(1, self.rng.randint(5, 12))) + "."
        if r < 0.75:
            i = self.rng.randrange(7)
            return self.rng.choice(
                [f"The day after {DAYS[i]} is {DAYS[(i + 1) % 7]}.", "The days of the week are " + ", ".join(DAYS) + "."]
            )
        if r < 0.85:
            i = self.rng.randrange(12)
            return self.rng.choice(
                [f"The month after {MONTHS[i]} is {MONTHS[(i + 1) % 12]}.", "The months of the year are " + ", ".join(MONTHS) + "."]
            )
        if r < 0.93:
            i = self.rng.randrange(25)
            letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            return self.rng.choice([f"The letter after {letters[i]} is {letters[i + 1]}.", " ".join(letters)])
        n = self.rng.randrange(len(NUMBER_WORDS))
        return f"The number {n} is written as {NUMBER_WORDS[n]}."

    # -- chat --------------------------------------------------------------------------------
    def qa_turn(self) -> tuple[str, str]:
        while True:
            c, a = self.rng.choice(COUNTRIES), self.rng.choice(ATTRIBUTES)
            if c.name not in self.chat_heldout[a]:
                break
        return fill(self.rng.choice(QUESTIONS[a]), c), fill(ANSWER[a], c, c.value(a))

    def other_turn(self) -> tuple[str, str]:
        r = self.rng.random()
        if r < 0.4:
            return self.rng.choice(SMALL_TALK)
        if r < 0.75:
            a, b = self.rng.choice(self.count_train)
            return f"Count from {a} to {b}.", count_text(a, b)
        if r < 0.9:
            n = self.rng.randint(1, COUNT_MAX)
            return f"What comes after {n}?", f"After {n} comes {n + 1}."
        c = self.rng.choice(COUNTRIES)
        return f"Tell me about {c.ref}.", self.profile(c)

    def chat(self, n_turns: int) -> str:
        messages = []
        if self.rng.random() < 0.25:
            messages.append({"role": "system", "content": self.rng.choice(SYSTEMS)})
        for _ in range(n_turns):
            q, a = self.qa_turn() if self.rng.random() < 0.7 else self.other_turn()
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return chat_doc(messages)

    def document(self) -> tuple[str, str]:
        r = self.rng.random()
        if r < 0.28:
            return "plain_facts", self.plain_facts() + EOS
        if r < 0.36:
            return "profile", self.profile() + EOS
        if r < 0.46:
            return "long_list", self.long_list() + EOS
        if r < 0.58:
            return "counting", self.counting() + EOS
        if r < 0.86:
            return "chat", self.chat(1)
        return "chat_multi", self.chat(self.rng.randint(2, 4))

    # -- evaluation --------------------------------------------------------------------------
    def eval_sets(self) -> dict:
        plain = [
            {"country": c.name, "attribute": a, "prompt": fill(PLAIN_PROMPT[a], c), "answer": c.value(a)}
            for c in COUNTRIES
            for a in ATTRIBUTES
        ]

        def chat_item(c: Country, a: str, question: str) -> dict:
            msgs = [{"role": "user", "content": fill(question, c)}]
            return {"country": c.name, "attribute": a, "messages": msgs,
                    "prompt": render_chat(msgs, add_generation_prompt=True), "answer": c.value(a),
                    "expected": fill(ANSWER[a], c, c.value(a))}

        heldout = [chat_item(c, a, QUESTIONS[a][0]) for a in ATTRIBUTES for c in COUNTRIES if c.name in self.chat_heldout[a]]
        phrasing = [chat_item(c, a, HELDOUT_QUESTIONS[a]) for a in ATTRIBUTES for c in COUNTRIES]
        counting = [{"prompt": f"Count from {a} to {b}:", "answer": " " + count_text(a, b)} for a, b in sorted(self.count_heldout)]
        long = []
        for _ in range(40):
            target = self.rng.choice(COUNTRIES)
            others = self.rng.sample([c for c in COUNTRIES if c is not target], 8)
            text = " ".join(["Some facts about the world:", *(self.fact_sentence(c) for c in others)])
            long.append({"country": target.name, "attribute": "capital",
                         "prompt": f"{text} {fill(PLAIN_PROMPT['capital'], target)}", "answer": target.capital})
        return {"plain": plain, "chat_heldout": heldout, "chat_new_phrasing": phrasing,
                "counting_heldout": counting, "long_plain": long}


def build(seed: int = SEED, n_docs: int = N_DOCS) -> tuple[list[dict], dict]:
    check_tables()
    b = Builder(seed)
    docs = [dict(zip(("kind", "text"), b.document())) for _ in range(n_docs)]
    ev = b.eval_sets()
    ev["chat_heldout_pairs"] = {a: sorted(s) for a, s in b.chat_heldout.items()}
    check_heldout(docs, ev)
    return docs, ev


def check_heldout(docs: list[dict], ev: dict) -> None:
    """Raises RuntimeError if a held-out question or counting range leaked into the corpus."""
    texts = set(d["text"] for d in docs)
    blob = "\n".join(texts)
    for item in ev["chat_heldout"] + ev["chat_new_phrasing"]:
        q = item["messages"][0]["content"]
        if f"<|user|>\n{q}<|assistant|>" in blob:
            raise RuntimeError(f"held-out chat question leaked into the corpus: {q!r}")
    for item in ev["counting_heldout"]:
        if item["prompt"] + item["answer"] in blob:
            raise RuntimeError(f"held-out counting range leaked into the corpus: {item['prompt']!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--n-docs", type=int, default=N_DOCS)
    args = ap.parse_args()
    docs, ev = build(args.seed, args.n_docs)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    ev["seed"] = args.seed
    (args.out / "eval.json").write_text(json.dumps(ev, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    kinds: dict[str, int] = {}
    for d in docs:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    print(f"{len(docs)} documents: {kinds}")
    print({k: len(v) for k, v in ev.items() if isinstance(v, list)})


if __name__ == "__main__":
    main()

"""tests/fixtures/demo/reference.json (and accuracy.json): what the engine must reproduce with
models/default.gguf.

Called by make_demo.py `finish`. Invariants:
- the HF model (transformers 5.24 `GlmMoeDsaForCausalLM`, eager attention, eager experts) runs with
  the weights READ FROM THE GGUF (dequantized by gguf-py, bit-exact with ggml; mapped back with
  fixturegen.gguf_to_hf), in float32 on the CPU;
- greedy continuations come from `generate(do_sample=False, eos_token_id=None)`: EOS is IGNORED,
  exactly N_NEW ids per prompt; they are checked to equal the argmax of the uncached full forward
  at every step (`generate_matches_full_forward`) and the float64 run (`float64_greedy_equal`);
- prompt ids are `tokenizer.encode(text, add_special_tokens=False)` (the GLM tokenizer adds no
  BOS); chat prompts are `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
  encoded the same way;
- `n_defined`: greedy_ids[:n_defined] are produced by rows BEFORE the first position with a
  top-k decision (DSA index or MoE expert) whose relative gap is below TIE_REL. Later ids depend
  on how a tie is broken and are not a valid target for an engine. Known cause: the embedding row
  of `<|endoftext|>` (= pad_token_id, HF's padding_idx) is zero, so a query at an `<|endoftext|>`
  position has all-zero index scores in layer 0 and the indexer's choice among the keys is
  arbitrary once more than index_topk keys exist (plain prompts continue past their EOS).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

N_NEW = 32
TOP_N = 5
TIE_REL = 1e-5

PLAIN = {
    "capital_france": "The capital of France is",
    "capital_japan": "The capital of Japan is",
    "continent_kenya": "Kenya is a country in",
    "currency_brazil": "The currency of Brazil is the",
    "count_heldout": "Count from 36 to 44:",
    "long_profile": (
        "Facts about Africa: The capital of Egypt is Cairo. People in Ghana speak English. Morocco is in Africa. "
        "The currency of Nigeria is the Nigerian naira. The capital of Uganda is Kampala. Kenya is a country in"
    ),
    "long_facts": (
        "Some facts about the world: The capital of Spain is Madrid. People in Kenya speak Swahili. "
        "Peru is in South America. The currency of Japan is the Japanese yen. The capital of Egypt is Cairo. "
        "In Norway, most people speak Norwegian. Vietnam is a country in Asia. The money used in India is the "
        "Indian rupee. The capital city of Chile is Santiago. Australia is located in Oceania. The capital of Canada is"
    ),
}
CHAT = {
    "chat_capital_france": [{"role": "user", "content": "What is the capital of France?"}],
    "chat_heldout_phrasing": [{"role": "user", "content": "Which city is the capital of Italy?"}],
    "chat_count": [{"role": "user", "content": "Count from 1 to 10."}],
    "chat_system_multi": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! I can tell you about countries, their capitals, languages and currencies."},
        {"role": "user", "content": "What is the currency of Japan?"},
    ],
}
TEMPLATE_CASES = [
    {"messages": CHAT["chat_system_multi"], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "user", "content": "Which continent is Peru in?"},
            {"role": "assistant", "content": "Peru is in South America."},
            {"role": "user", "content": "And its capital?"},
            {"role": "assistant", "content": "The capital of Peru is Lima."},
        ],
        "add_generation_prompt": False,
    },
]


def load_gguf_model(hf_dir: Path, gguf_path: Path):
    """HF model from `hf_dir`'s config.json with EVERY weight and buffer taken from the GGUF."""
    from transformers import AutoConfig, GlmMoeDsaForCausalLM

    from fixturegen import gguf_to_hf

    model = GlmMoeDsaForCausalLM(AutoConfig.from_pretrained(hf_dir)).to(torch.float32).eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    arrays, _ = gguf_to_hf.read_dequantized(gguf_path)
    gguf_to_hf.load_into(model, gguf_to_hf.to_hf_state_dict(arrays))
    return model


def decision_summary(decisions: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for d in decisions:
        s = out.setdefault(d["kind"], {"count": 0, "min_rel_gap": math.inf})
        s["count"] += 1
        s["min_rel_gap"] = min(s["min_rel_gap"], d["rel_gap"])
    return out


def first_tie_row(decisions: list[dict]) -> int | None:
    rows = [d["row"] for d in decisions if d["rel_gap"] < TIE_REL]
    return min(rows) if rows else None


def prompt_entry(tok, ids: list[int], res: dict, greedy64: list[int], stop_ids: set[int]) -> dict:
    greedy = res["greedy"]
    tie = first_tie_row(res["decisions"])  # a position in prompt + greedy[:-1]
    n_defined = N_NEW if tie is None else max(0, min(N_NEW, tie - (len(ids) - 1)))
    full = ids + greedy[:-1]
    argmax = [int(np.argmax(res["logits"][r])) for r in range(len(ids) - 1, len(full))]
    rows = range(len(ids) - 1, len(ids) - 1 + N_NEW)
    logits = res["logits"]
    top = []
    for r in rows:
        order = np.argsort(-logits[r], kind="stable")[:TOP_N]
        top.append([[int(i), round(float(logits[r][i]), 5)] for i in order])
    stop = next((i for i, t in enumerate(greedy) if t in stop_ids), None)
    return {
        "prompt_ids": ids,
        "prompt_len": len(ids),
        "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy),
        "first_stop_index": stop,
        "greedy_text_until_stop": tok.decode(greedy[:stop] if stop is not None else greedy),
        "top5": top,
        "argmax_rel_margins": [round(m, 6) for m in res["argmax_margins"]],
        "min_argmax_rel_margin": min(res["argmax_margins"]),
        "decisions": decision_summary(res["decisions"]),
        "first_tie_position": tie,
        "n_defined": n_defined,
        "generate_matches_full_forward": argmax[:n_defined] == greedy[:n_defined],
        "generate_matches_full_forward_all": res["generate_matches_full_forward"],
        "float64_greedy_equal": greedy64[:n_defined] == greedy[:n_defined],
        "float64_greedy_equal_all": greedy64 == greedy,
    }


def build_reference(model, tok, cfg, stop_ids: set[int]) -> dict:
    from fixturegen import reference

    texts = {name: {"kind": "plain", "prompt_text": t} for name, t in PLAIN.items()}
    for name, msgs in CHAT.items():
        rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        texts[name] = {"kind": "chat", "messages": msgs, "prompt_text": rendered}
    ids = {name: tok.encode(v["prompt_text"], add_special_tokens=False) for name, v in texts.items()}
    results = reference.run_variant(model, cfg, ids, N_NEW)
    m64 = copy.deepcopy(model).to(torch.float64)
    prompts = {}
    for name, v in texts.items():
        g64 = reference.greedy(m64, ids[name], N_NEW)
        prompts[name] = {**v, **prompt_entry(tok, ids[name], results[name], g64, stop_ids)}
        e = prompts[name]
        if not (e["generate_matches_full_forward"] and e["float64_greedy_equal"]):
            raise RuntimeError(f"{name}: greedy ids differ between generate / full forward / float64 before any tie")
        print(f"  {name}: {len(ids[name])} ids, n_defined {e['n_defined']} -> {e['greedy_text_until_stop']!r}", flush=True)
    templates = []
    for case in TEMPLATE_CASES:
        rendered = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=case["add_generation_prompt"])
        templates.append({**case, "rendered": rendered, "ids": tok.encode(rendered, add_special_tokens=False)})
    return {"prompts": prompts, "chat_templates": templates}


def write_all(hf_dir: Path, gguf_path: Path, eval_path: Path, out_dir: Path, llama_dir: Path,
              skip_eval: bool, gguf_meta: dict) -> None:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from accuracy import evaluate
    from make_fixtures import versions

    import recipe

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = load_gguf_model(hf_dir, gguf_path)
    cfg = model.config
    stop_ids = set(cfg.eos_token_id)
    ref = build_reference(model, tok, cfg, stop_ids)
    doc = {
        "model": "models/default.gguf",
        "gguf": gguf_meta,
        "how": "HF GlmMoeDsaForCausalLM (transformers 5.24.0) with the GGUF's weights dequantized by gguf-py, "
               "float32 CPU compute, eager attention and experts; greedy generate, EOS ignored",
        "n_new": N_NEW,
        "stop_ids": sorted(stop_ids),
        "index_topk": cfg.index_topk,
        "prompt_ids_from": "tokenizer.encode(prompt_text, add_special_tokens=False); chat prompt_text = apply_chat_template("
                           "messages, tokenize=False, add_generation_prompt=True)",
        "top5": "per generated step: [[id, logit], ...] of the distribution that produced greedy_ids[i]",
        "argmax_rel_margins": "(top1 - top2) / max|logits row| per generated step",
        "decisions": "per top-k kind (moe_expert, dsa_index): count and min relative gap, prompt + continuation",
        "n_defined": f"compare only greedy_ids[:n_defined] / top5[:n_defined]: later ids follow a top-k decision with "
                     f"relative gap < {TIE_REL} (a tie; see first_tie_position, a position in prompt + greedy)",
        "versions": versions(llama_dir),
        "recipe": {"model": recipe.MODEL, "extra_config_json": recipe.EXTRA_CONFIG_JSON},
        **ref,
    }
    (out_dir / "reference.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=_json_default) + "\n", encoding="utf-8")
    if skip_eval:
        return
    ev = json.loads(eval_path.read_text(encoding="utf-8"))
    res = evaluate(model, tok, ev, torch.device("cpu"), stop_ids)
    res["how"] = "greedy on the CPU, float32, weights read from models/default.gguf (tools/demo_model/accuracy.py)"
    (out_dir / "accuracy.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(res["results"]), flush=True)


def main() -> None:
    """Regenerates reference.json (and with --eval accuracy.json) from an existing finish run."""
    import argparse

    here = Path(__file__).resolve().parent
    repo = here.parent.parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent))
    from make_demo import DATA, FIXTURES, GGUF_OUT, check_gguf_equals_bf16, sha256  # noqa: F401

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--eval", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    old = json.loads((FIXTURES / "reference.json").read_text()) if (FIXTURES / "reference.json").exists() else {}
    meta = old.get("gguf") or {"bytes": GGUF_OUT.stat().st_size}
    if meta.get("sha256") != sha256(GGUF_OUT):
        raise SystemExit(f"{GGUF_OUT} changed since the last finish run; rerun make_demo.py finish")
    write_all(DATA / "hf", GGUF_OUT, DATA / "eval.json", FIXTURES, args.llama_cpp, skip_eval=not args.eval, gguf_meta=meta)
    print(f"wrote {(FIXTURES / 'reference.json').relative_to(repo)}")


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    return str(o)


if __name__ == "__main__":
    main()

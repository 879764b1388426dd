"""Reference renders for tests/chat_templates.rs, made with transformers' own chat-template
renderer (the function `apply_chat_template` calls), so the Rust renderer is compared with HF.

Run: /work/pyenv/venv/bin/python make_cases.py   (transformers 5.24.0, jinja2 >= 3.1.6)
Writes cases.json: [{template, bos_token, eos_token, messages, add_generation_prompt, extra, rendered}].
Templates: deepseek-v3.1.jinja (deepseek-ai/DeepSeek-V3.1, MIT), glm-4.7-flash.jinja
(zai-org/GLM-4.7-Flash, MIT), qwen3.jinja (Qwen/Qwen3-0.6B, Apache-2.0), features.jinja (ours).
"""
import json
from pathlib import Path

import transformers
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = Path(__file__).parent
DS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
TEMPLATES = {
    "deepseek-v3.1.jinja": DS,
    "glm-4.7-flash.jinja": ("[gMASK]", "<|endoftext|>"),
    "qwen3.jinja": (None, "<|im_end|>"),
    "features.jinja": ("<s>", "</s>"),
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city <now> & \"later\"",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City, e.g. Zürich"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}}
CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "Hello!"}],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."},
        {"role": "user", "content": "  And 3+3? 你好 🦀  "},
    ],
    "reasoning": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nhmm, tricky\n</think>\n\nDone.", "tool_calls": None},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "quick thought"},
        {"role": "user", "content": "Last."},
    ],
    "tools": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "Thanks"},
    ],
}
FEATURES_ONLY = {
    "structured": [
        {"role": "user", "content": "Hello, big world!"},
        {"role": "skip", "content": "not shown"},
        {"role": "assistant", "content": {"b": [1, 2.5, None, True], "a": "x\"y\n€<>", "e": {}}, "maybe": "yes"},
        {"role": "stop", "content": "loop ends"},
        {"role": "user", "content": "never reached"},
    ],
}


def main():
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        source = (HERE / name).read_text()
        convs = dict(CONVERSATIONS, **(FEATURES_ONLY if name == "features.jinja" else {}))
        for conv_name, messages in convs.items():
            for gen in (True, False):
                extras = [{}]
                if conv_name == "tools":
                    extras = [{"tools": TOOLS}]
                if conv_name == "one_user" and gen:
                    extras += [{"enable_thinking": True}, {"enable_thinking": False}, {"thinking": True}]
                for extra in extras:
                    kwargs = dict(extra)
                    tools = kwargs.pop("tools", None)
                    special = {"bos_token": bos or "", "eos_token": eos}
                    rendered, _ = render_jinja_template(
                        conversations=[_normalize_chat_messages(messages)],
                        tools=tools,
                        chat_template=source,
                        add_generation_prompt=gen,
                        **special,
                        **kwargs,
                    )
                    cases.append(
                        {
                            "template": name,
                            "conversation": conv_name,
                            "bos_token": bos,
                            "eos_token": eos,
                            "messages": messages,
                            "add_generation_prompt": gen,
                            "extra": extra,
                            "rendered": rendered[0],
                        }
                    )
    out = {"transformers": transformers.__version__, "cases": cases}
    (HERE / "cases.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()

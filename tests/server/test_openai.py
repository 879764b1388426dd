"""The official `openai` client against a live mlaserve server (started by tests/server/run.sh on a
tiny fixture model): completions and chat, streaming and not, usage, stop strings, seeds, 64
concurrent streams equal to lone greedy runs, disconnects that free blocks, and a barrage of bad
requests after which the server still serves."""

import asyncio
import json
import socket
import time

import openai
import pytest

from conftest import metric, wait_until_idle

GREEDY = {"temperature": 0}
NO_EOS = {"ignore_eos": True}


def test_health_and_models(http, client, model):
    assert http.get("/health").status_code == 200
    card = client.models.list().data[0]
    assert card.id == model
    assert card.object == "model"
    assert http.get("/v1/models").json()["data"][0]["max_model_len"] > 0


def test_completion_usage_and_finish_reason(client, model):
    r = client.completions.create(model=model, prompt="Hello world", max_tokens=9, extra_body=NO_EOS, **GREEDY)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert len(r.choices) == 1
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].text, str)
    assert r.usage.completion_tokens == 9
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 9


def test_completion_stream_equals_non_stream(client, model):
    kwargs = dict(model=model, prompt="The quick brown fox", max_tokens=16, extra_body=NO_EOS, **GREEDY)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == 16
    assert usage_chunk.usage.prompt_tokens == full.usage.prompt_tokens
    text = "".join(c.choices[0].text for c in chunks[:-1])
    assert text == full.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"


def test_chat_and_its_stream(client, model):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    kwargs = dict(model=model, messages=messages, max_completion_tokens=12, extra_body=NO_EOS, **GREEDY)
    full = client.chat.completions.create(**kwargs)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 12
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == full.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]


def test_stop_strings(client, model):
    base = client.completions.create(model=model, prompt="Hello", max_tokens=24, extra_body=NO_EOS, **GREEDY)
    text = base.choices[0].text
    assert len(text) >= 8, f"need text to cut: {text!r}"
    stop = text[4:7]
    expected = text[: text.index(stop)]
    cut = client.completions.create(model=model, prompt="Hello", max_tokens=24, stop=[stop, "\x00never"],
                                    extra_body=NO_EOS, **GREEDY)
    assert cut.choices[0].text == expected
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=model, prompt="Hello", max_tokens=24, stop=stop, stream=True,
                                         extra_body=NO_EOS, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_seed_reproducibility_and_n(client, model):
    def run(seed, n=1):
        r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=1.0,
                                      seed=seed, n=n, extra_body=NO_EOS)
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)]

    assert run(1234) == run(1234)
    fan = run(1234, n=3)
    assert len(fan) == 3
    assert fan[0] == run(1234)[0] and fan[2] == run(1236)[0], "choice i samples with seed + i"
    assert len({run(s)[0] for s in (1, 2, 3)}) > 1, "different seeds gave identical samples"


def test_logprobs(client, model):
    r = client.completions.create(model=model, prompt="A", max_tokens=4, logprobs=2, extra_body=NO_EOS, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(x <= 0 for x in lp.token_logprobs)
    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                       logprobs=True, top_logprobs=2, extra_body=NO_EOS, **GREEDY)
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)


async def _greedy_stream(async_client, model, prompt, max_tokens):
    stream = await async_client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                   extra_body=NO_EOS, **GREEDY)
    text, finish = [], None
    async for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(text), finish


def test_64_concurrent_streams_equal_lone_greedy_runs(client, async_client, model, http):
    prompts = [f"Request {i}: the {['cat', 'dog', 'sun', 'sea'][i % 4]} is" for i in range(64)]
    max_tokens = 24
    alone = []
    for p in prompts:
        r = client.completions.create(model=model, prompt=p, max_tokens=max_tokens, extra_body=NO_EOS, **GREEDY)
        assert r.usage.completion_tokens == max_tokens
        alone.append(r.choices[0].text)

    async def all_at_once():
        return await asyncio.gather(*(_greedy_stream(async_client, model, p, max_tokens) for p in prompts))

    together = asyncio.run(all_at_once())
    for i, ((text, finish), lone) in enumerate(zip(together, alone)):
        assert finish == "length", f"stream {i} did not finish"
        assert text == lone, f"stream {i} differs from its lone greedy run:\n{text!r}\n{lone!r}"
    wait_until_idle(http)


def _open_stream(base_url, body: dict) -> socket.socket:
    """A raw HTTP/1.1 streaming request whose socket the test can slam shut."""
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    )
    return sock


def test_disconnect_mid_stream_frees_blocks(http, base_url, model):
    wait_until_idle(http)
    before = metric(http.get("/metrics").text, "mlaserve:request_success_total", finished_reason="abort")
    body = {"model": model, "prompt": "Tell me a long story", "max_tokens": 200, "stream": True, **GREEDY, **NO_EOS}
    sock = _open_stream(base_url, body)
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(4096)
    running = http.get("/metrics").text
    assert metric(running, "mlaserve:cache_blocks_used") > 0, "the stream should hold cache blocks"
    sock.close()
    text = wait_until_idle(http)
    assert metric(text, "mlaserve:request_success_total", finished_reason="abort") == before + 1


def test_disconnect_while_waiting_for_a_non_streaming_reply(http, base_url, model):
    wait_until_idle(http)
    before = metric(http.get("/metrics").text, "mlaserve:request_success_total", finished_reason="abort")
    body = {"model": model, "prompt": "Another long story", "max_tokens": 230, **GREEDY, **NO_EOS}
    sock = _open_stream(base_url, body)
    is_running = False
    for _ in range(500):
        if metric(http.get("/metrics").text, "mlaserve:cache_blocks_used") > 0:
            is_running = True
            break
        time.sleep(0.002)
    assert is_running, "the request never started"
    sock.close()
    text = wait_until_idle(http)
    assert metric(text, "mlaserve:request_success_total", finished_reason="abort") == before + 1


BAD_REQUESTS = [
    ("POST", "/v1/completions", b'{"prompt": "x"', 400),
    ("POST", "/v1/completions", b"", 400),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', 400),
    ("POST", "/v1/completions", {"model": "no-such-model", "prompt": "x"}, 404),
    ("POST", "/v1/completions", {"prompt": ""}, 400),
    ("POST", "/v1/completions", {"prompt": []}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "temperature": -1}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "top_p": 0}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "top_p": 1.5}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "top_k": -5}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "min_p": 2}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "n": 0}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "logprobs": 21}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "presence_penalty": 9}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "repetition_penalty": -1}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "stop": 3}, 400),
    ("POST", "/v1/completions", {"prompt": [10**6]}, 400),
    ("POST", "/v1/completions", {"prompt": [5] * 100000}, 400),
    ("POST", "/v1/chat/completions", {"messages": []}, 400),
    ("POST", "/v1/chat/completions", {"messages": "hello"}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 5}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("GET", "/v1/completions", None, 405),
    ("GET", "/v1/does-not-exist", None, 404),
]


@pytest.mark.parametrize("method,path,body,status", BAD_REQUESTS)
def test_bad_request_gets_openai_error(http, method, path, body, status):
    content = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    r = http.request(method, path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert "param" in err and "code" in err


def test_client_errors_raise_typed_exceptions_and_server_survives(client, model):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", max_tokens=10**7)
    assert "maximum context length" in str(e.value)
    r = client.completions.create(model=model, prompt="Still alive?", max_tokens=3, extra_body=NO_EOS, **GREEDY)
    assert r.usage.completion_tokens == 3


def test_metrics_exposition(http, model):
    text = http.get("/metrics").text
    assert metric(text, "mlaserve:engine_ready") == 1
    assert metric(text, "mlaserve:time_to_first_token_seconds_count") > 0
    assert metric(text, "mlaserve:e2e_request_latency_seconds_count") > 0
    assert metric(text, "mlaserve:generation_tokens_total") > 0
    assert 0 <= metric(text, "mlaserve:kv_cache_usage_perc") <= 1
    assert metric(text, "mlaserve:prefix_cache_queries_total") >= metric(text, "mlaserve:prefix_cache_hits_total")
    assert metric(text, "mlaserve:http_requests_total", route="/v1/completions", status="200") > 0

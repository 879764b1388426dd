//! Router tests against a real engine running the tiny DeepSeek-V2 fixture (no mock model):
//! completions and chat, streaming and not, fan-out, seeds, logprobs, stop strings and the
//! context-window checks.

mod common;

use common::{greedy, live_app, post, stream_chunks, wait_until_idle, MODEL};
use serde_json::{json, Value};

#[tokio::test]
async fn completion_matches_its_stream_and_counts_usage() {
    let (app, engine) = live_app();
    let reply = post(&app, "/v1/completions", &greedy(json!("Hello world"), 12)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    let text = choice["text"].as_str().unwrap().to_owned();
    let prompt_len = engine
        .tokenizer()
        .encode("Hello world", true)
        .unwrap()
        .len();
    assert_eq!(body["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(body["usage"]["completion_tokens"], 12);
    assert_eq!(body["usage"]["total_tokens"], prompt_len + 12);

    let mut streamed = greedy(json!("Hello world"), 12);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let reply = post(&app, "/v1/completions", &streamed).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = stream_chunks(&reply.sse_data());
    let (usage_chunk, token_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 12);
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt_len);
    let joined: String = token_chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined, text,
        "streamed text differs from the non-streamed one"
    );
    assert_eq!(
        token_chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(token_chunks
        .iter()
        .all(|c| c["object"] == "text_completion" && c.get("usage").is_none()));
    wait_until_idle(&engine).await;
}

#[tokio::test]
async fn chat_matches_its_stream() {
    let (app, engine) = live_app();
    let body = json!({"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"}], "max_completion_tokens": 10, "temperature": 0, "ignore_eos": true});
    let reply = post(&app, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let full = reply.json();
    assert_eq!(full["object"], "chat.completion");
    assert!(full["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["completion_tokens"], 10);
    let rendered = engine.tokenizer().chat_template().unwrap().render(
        &[
            mlaserve_tokenizer::ChatMessage::new("system", "Be brief."),
            mlaserve_tokenizer::ChatMessage::new("user", "Hi there"),
        ],
        true,
    );
    let prompt_len = engine
        .tokenizer()
        .encode(&rendered.unwrap(), false)
        .unwrap()
        .len();
    assert_eq!(full["usage"]["prompt_tokens"], prompt_len);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream_chunks(
        &post(&app, "/v1/chat/completions", &streamed)
            .await
            .sse_data(),
    );
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(
        content,
        full["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    wait_until_idle(&engine).await;
}

#[tokio::test]
async fn fan_out_seeds_and_prompt_shapes() {
    let (app, engine) = live_app();
    let sampled = |n: usize, seed: i64| {
        json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 8, "n": n, "seed": seed,
               "temperature": 1.0, "ignore_eos": true})
    };
    let a = post(&app, "/v1/completions", &sampled(3, 42)).await.json();
    let b = post(&app, "/v1/completions", &sampled(3, 42)).await.json();
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(texts(&a).len(), 3);
    assert_eq!(texts(&a), texts(&b), "same seed, same choices");
    let indices: Vec<u64> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, vec![0, 1, 2]);
    // Choice i runs with seed + i, as vLLM's parallel sampling.
    let third = post(&app, "/v1/completions", &sampled(1, 44)).await.json();
    assert_eq!(texts(&third)[0], texts(&a)[2]);
    assert_eq!(a["usage"]["completion_tokens"], 24);

    // Token-id prompts give what the same ids as text give.
    let ids = engine.tokenizer().encode("Once upon", true).unwrap();
    let by_text = post(&app, "/v1/completions", &greedy(json!("Once upon"), 6))
        .await
        .json();
    let by_ids = post(&app, "/v1/completions", &greedy(json!(ids), 6))
        .await
        .json();
    assert_eq!(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);

    // Two prompts x n=2: indices prompt * n + i, prompt tokens counted once per prompt.
    let mut two = greedy(json!(["Once upon", "A dog"]), 4);
    two["n"] = json!(2);
    let reply = post(&app, "/v1/completions", &two).await.json();
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let six_tokens = by_text["choices"][0]["text"].as_str().unwrap();
    assert!(
        six_tokens.starts_with(choices[0]["text"].as_str().unwrap()),
        "greedy 4 tokens prefix greedy 6"
    );
    assert_eq!(
        choices[0]["text"], choices[1]["text"],
        "greedy choices of one prompt agree"
    );
    let a_dog = engine.tokenizer().encode("A dog", true).unwrap().len();
    assert_eq!(reply["usage"]["prompt_tokens"], ids.len() + a_dog);
    assert_eq!(reply["usage"]["completion_tokens"], 16);

    // The same fan-out streamed: interleaved chunks, one finish per choice, usage once.
    two["stream"] = json!(true);
    two["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&post(&app, "/v1/completions", &two).await.sse_data());
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["usage"], reply["usage"]);
    for (index, choice) in choices.iter().enumerate() {
        let mine: Vec<&Value> = rest
            .iter()
            .map(|c| &c["choices"][0])
            .filter(|c| c["index"] == index)
            .collect();
        let text: String = mine.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(text, choice["text"].as_str().unwrap(), "choice {index}");
        let finishes: Vec<&Value> = mine
            .iter()
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finishes, vec![&json!("length")], "choice {index}");
    }

    // echo: the prompt comes back in front of the completion, streamed or not.
    let mut echo = greedy(json!("Once upon"), 6);
    echo["echo"] = json!(true);
    let echoed = post(&app, "/v1/completions", &echo).await.json();
    assert_eq!(
        echoed["choices"][0]["text"],
        format!("Once upon{six_tokens}")
    );
    echo["stream"] = json!(true);
    let chunks = stream_chunks(&post(&app, "/v1/completions", &echo).await.sse_data());
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, format!("Once upon{six_tokens}"));
    wait_until_idle(&engine).await;
}

#[tokio::test]
async fn logprobs_have_openai_shapes() {
    let (app, engine) = live_app();
    let mut body = greedy(json!("The cat"), 5);
    body["logprobs"] = json!(3);
    let reply = post(&app, "/v1/completions", &body).await.json();
    let lp = &reply["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["text_offset"][0], 0);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!((1..=4).contains(&top.len()), "{top:?}");
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-5,
            "greedy token is not the top one: {chosen} vs {best}"
        );
    }

    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hey"}], "max_tokens": 4,
        "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let reply = post(&app, "/v1/chat/completions", &chat).await.json();
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 4);
    for entry in content {
        assert!(entry["token"].is_string() && entry["bytes"].is_array());
        assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
    }
    let no_lp = post(
        &app,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hey"}], "max_tokens": 2}),
    )
    .await
    .json();
    assert!(no_lp["choices"][0]["logprobs"].is_null());
    wait_until_idle(&engine).await;
}

#[tokio::test]
async fn stop_strings_cut_the_text() {
    let (app, engine) = live_app();
    let full = post(&app, "/v1/completions", &greedy(json!("Hello"), 24))
        .await
        .json();
    let text: Vec<char> = full["choices"][0]["text"]
        .as_str()
        .unwrap()
        .chars()
        .collect();
    assert!(text.len() >= 8, "need some text to cut: {text:?}");
    let stop: String = text[4..7].iter().collect();
    let text: String = text.iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    let mut body = greedy(json!("Hello"), 24);
    body["stop"] = json!(stop);
    let cut = post(&app, "/v1/completions", &body).await.json();
    assert_eq!(cut["choices"][0]["text"], expected);
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let chunks = stream_chunks(&post(&app, "/v1/completions", &body).await.sse_data());
    let joined: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(joined, expected);
    wait_until_idle(&engine).await;
}

#[tokio::test]
async fn context_and_vocabulary_limits_are_400() {
    let (app, engine) = live_app();
    let max_len = engine.max_model_len();
    let prompt_len = engine.tokenizer().encode("Hello", true).unwrap().len();
    let err = post(&app, "/v1/completions", &greedy(json!("Hello"), max_len))
        .await
        .error(400);
    assert_eq!(err["code"], "context_length_exceeded");
    let expected = format!(
        "'max_tokens' or 'max_completion_tokens' is too large: {max_len}. This model's maximum context length is \
         {max_len} tokens and your request has {prompt_len} input tokens ({max_len} > {max_len} - {prompt_len})."
    );
    assert_eq!(err["message"], expected);
    let long: Vec<u32> = vec![5; max_len + 3];
    let err = post(&app, "/v1/completions", &greedy(json!(long), 1))
        .await
        .error(400);
    assert!(err["message"]
        .as_str()
        .unwrap()
        .contains(&format!("your request has {} input tokens", max_len + 3)));
    // A long text prompt (tokenized on the blocking pool) hits the same check.
    let huge = "lorem ipsum ".repeat(4000);
    let err = post(&app, "/v1/completions", &greedy(json!(huge), 1))
        .await
        .error(400);
    assert_eq!(err["code"], "context_length_exceeded", "{err}");
    let vocab = engine.model_config().vocab_size;
    let err = post(&app, "/v1/completions", &greedy(json!([1, vocab + 10]), 2))
        .await
        .error(400);
    assert!(
        err["message"].as_str().unwrap().contains("vocabulary"),
        "{err}"
    );
    // Chat without max_tokens may fill the rest of the window.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": true});
    let reply = post(&app, "/v1/chat/completions", &chat).await.json();
    let usage = &reply["usage"];
    assert_eq!(usage["total_tokens"], max_len, "{usage}");
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    wait_until_idle(&engine).await;
}

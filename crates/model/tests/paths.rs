//! The three ways to attend agree with each other and with HF: forced unabsorbed (mha),
//! forced absorbed (mqa), and chunked prefill over cached context (chunks of 1, 3, 7 tokens),
//! including 1-token prompts and prompts longer than the DSA `index_topk` (GLM fixture).

mod common;
use common::*;
use mlaserve_model::score::score;
use mlaserve_model::AttentionPath;

#[test]
fn every_path_matches_hf_f32() {
    for m in MODELS {
        let model = load(m, &format!("{m}-f32.gguf"));
        let r = Reference::load(m);
        let vocab = model.config().vocab_size;
        for (name, _) in &r.prompts {
            let ids = r.input("f32", name);
            let want = &r.logits[&format!("f32.{name}")];
            for (path, chunk, label) in [
                (AttentionPath::Mha, 0, "mha"),
                (AttentionPath::Mqa, 0, "mqa"),
                (AttentionPath::Auto, 1, "chunk1 (decode path)"),
                (AttentionPath::Auto, 3, "chunk3 (context path)"),
                (AttentionPath::Auto, 7, "chunk7 (context path)"),
                (AttentionPath::Mha, 5, "mha chunk5"),
                (AttentionPath::Mqa, 4, "mqa chunk4"),
            ] {
                let got = score(&model, &ids, path, chunk).unwrap();
                let err = max_rel_err(&got, want, vocab);
                assert!(err <= 1e-4, "{m} {name} {label}: max rel err {err:.3e}");
            }
        }
    }
}

#[test]
fn one_token_prompt_is_identical_on_both_paths() {
    for m in MODELS {
        let model = load(m, &format!("{m}-f32.gguf"));
        let mha = score(&model, &[5], AttentionPath::Mha, 0).unwrap();
        let mqa = score(&model, &[5], AttentionPath::Mqa, 0).unwrap();
        let vocab = model.config().vocab_size;
        assert!(max_rel_err(&mqa, &mha, vocab) <= 1e-5, "{m}");
    }
}

#[test]
fn glm_long_prompt_really_is_sparse() {
    // The reference's len24 prompt + greedy is longer than index_topk: a dense model would differ.
    let model = load("glm_moe_dsa", "glm_moe_dsa-f32.gguf");
    let topk = model.config().indexer.as_ref().unwrap().topk;
    let r = Reference::load("glm_moe_dsa");
    let ids = r.input("f32", "len24");
    assert!(
        ids.len() > 2 * topk,
        "fixture prompt must exceed index_topk"
    );
    mlaserve_model::probe::start_capture("L*.dsa.topk");
    score(&model, &ids, AttentionPath::Auto, 0).unwrap();
    let recs = mlaserve_model::probe::take_capture();
    assert_eq!(recs.len(), model.config().num_layers);
    // The last token selected exactly topk positions, not all of them.
    let last = &recs[0].data[(ids.len() - 1) * topk..ids.len() * topk];
    assert!(last.iter().all(|&p| p >= 0.0));
    assert!(
        last.iter().any(|&p| p as usize + 1 < ids.len() - topk),
        "selection is not just a recent window"
    );
}

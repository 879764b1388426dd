"""Every setting of the demo model: architecture (HF `GlmMoeDsaConfig` kwargs) and training.

Invariants:
- GLM-5 features are all on: MLA with q_lora, qk_nope (48) != v_head (64), interleaved RoPE,
  first layer dense then MoE with one shared expert and sigmoid + bias (`noaux_tc`) routing, a DSA
  indexer on every layer with `index_topk` (32) below the longest training documents;
- `rms_norm_eps` is 1e-6 (HF builds q_a/kv_a norms with eps 1e-6 whatever the config says, GGUF
  stores one eps for all norms);
- sized so the BF16 GGUF stays under 25 MB (10.67M parameters -> ~21.4 MB);
- `train.py` reads only this module and the data bundle; the step count actually used is written
  to `train_log.json` (the timing probe may lower `max_steps`; rerun with `--steps N` to repeat).
"""

from __future__ import annotations

VOCAB_SIZE = 2048
N_LAYERS = 5

MODEL = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=768,  # dense FFN of layer 0
    moe_intermediate_size=128,
    num_hidden_layers=N_LAYERS,
    num_attention_heads=8,
    num_key_value_heads=8,
    n_routed_experts=16,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    mlp_layer_types=["dense"] + ["sparse"] * (N_LAYERS - 1),
    q_lora_rank=128,
    kv_lora_rank=128,
    qk_nope_head_dim=48,
    qk_rope_head_dim=16,
    v_head_dim=64,
    routed_scaling_factor=2.5,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    index_n_heads=8,
    index_head_dim=64,  # llama.cpp's glm-dsa graph aborts at 32
    index_topk=32,
    indexer_types=["full"] * N_LAYERS,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    initializer_range=0.02,
    rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
)
# Keys added to config.json after save_pretrained (llama.cpp and vLLM read them; HF ignores them).
EXTRA_CONFIG_JSON = {
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "rope_interleave": True,
    "indexer_rope_interleave": True,
}

TRAIN = dict(
    seed=1234,  # torch.manual_seed before building the model (HF init) and the batch order
    max_steps=6000,
    batch_docs=256,  # documents per step (length-bucketed, right-padded)
    bucket_batches=50,  # documents are sorted by length within windows of 50 batches
    dense_warmup_frac=0.3,  # first 30% of steps: dense attention (indexer selects all keys)
    lr=2e-3,
    min_lr=1e-4,
    warmup_steps=200,
    betas=(0.9, 0.95),
    weight_decay=0.01,  # on matrices only (not norms, biases, router bias buffers)
    grad_clip=1.0,
    indexer_kl_weight=1.0,
    bias_update_rate=1e-3,  # aux-loss-free balancing: b_i += rate * sign(mean_load - load_i)
    time_budget_s=300.0,  # the timing probe lowers max_steps so training fits in this budget
    log_every=50,
)

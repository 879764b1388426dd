"""Model specifications of the three tiny fixture models.

Invariants:
- every head / expert count is divisible by 4 (TP=2/4 tests);
- every feature of the real architecture is switched on (see tests/fixtures/models/README.md);
- `rms_norm_eps` is 1e-6 everywhere, because HF builds `q_a_layernorm`/`kv_a_layernorm` with
  the class default eps 1e-6 regardless of the config while GGUF stores one eps for all norms;
  with 1e-6 both agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# First seed tried for each model; the generator walks seed, seed+1, ... until every top-k
# decision of every reference prompt has a relative gap >= MIN_REL_GAP (see reference.py).
MIN_REL_GAP = 1e-4
PROMPT_SEED = 20260401
PROMPT_LENGTHS = (1, 6, 13, 24)
N_GREEDY = 16


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # HF architectures[0]
    hf_config: dict[str, Any]  # kwargs for the HF config class
    extra_config_json: dict[str, Any]  # keys added to config.json after save_pretrained
    tokenizer: str  # "deepseek" or "glm"
    base_seed: int
    kquant: bool = False  # also make a llama-quantize Q4_K_M file
    legacy: bool = False  # also write the legacy attn_kv_b layout
    notes: list[str] = field(default_factory=list)


COMMON = dict(
    vocab_size=512,
    intermediate_size=128,  # dense FFN of the first layer
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    kv_lora_rank=64,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
)

DEEPSEEK_V2 = ModelSpec(
    name="deepseek_v2",
    arch="DeepseekV2ForCausalLM",
    hf_config=dict(
        COMMON,
        hidden_size=128,
        q_lora_rank=None,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_shared_experts=2,
        routed_scaling_factor=2.0,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        norm_topk_prob=False,
        bos_token_id=0,
        eos_token_id=1,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=8.0,
            original_max_position_embeddings=32,
            mscale=0.707,
            mscale_all_dim=0.707,
            beta_fast=32,
            beta_slow=1,
        ),
    ),
    extra_config_json={"scoring_func": "softmax"},
    tokenizer="deepseek",
    base_seed=2000,
)

DEEPSEEK_V3 = ModelSpec(
    name="deepseek_v3",
    arch="DeepseekV3ForCausalLM",
    hf_config=dict(
        COMMON,
        hidden_size=128,
        q_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
        rope_interleave=True,
        bos_token_id=0,
        eos_token_id=1,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=4.0,
            original_max_position_embeddings=64,
            mscale=1.0,
            mscale_all_dim=1.0,
            beta_fast=32,
            beta_slow=1,
        ),
    ),
    # transformers 5.x does not write these; without them llama.cpp routes with softmax.
    extra_config_json={"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    tokenizer="deepseek",
    base_seed=3000,
    legacy=True,
)

GLM_MOE_DSA = ModelSpec(
    name="glm_moe_dsa",
    arch="GlmMoeDsaForCausalLM",
    hf_config=dict(
        COMMON,
        hidden_size=256,  # rows of 256 make q_a/kv_a/wk/experts' gate+up/embeddings K-quantizable
        q_lora_rank=64,
        qk_nope_head_dim=48,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        # 8, not 4: with 4 heads relu(q.k) is 0 for all heads with probability 1/16, so index
        # scores of exactly 0.0 tie at the top-k boundary all the time (seen with 4 heads).
        index_n_heads=8,
        index_head_dim=64,  # llama.cpp's glm-dsa graph aborts at 32
        index_topk=8,
        indexer_types=["full", "full", "full"],
        mlp_layer_types=["dense", "sparse", "sparse"],
        bos_token_id=None,
        eos_token_id=None,  # filled from the tokenizer
        rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
    ),
    extra_config_json={
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        # vLLM reads these for GLM-5 (both interleaved); HF 5.24 ignores them and is interleaved.
        "rope_interleave": True,
        "indexer_rope_interleave": True,
    },
    tokenizer="glm",
    base_seed=5000,
    kquant=True,
)

SPECS = {s.name: s for s in (DEEPSEEK_V3, DEEPSEEK_V2, GLM_MOE_DSA)}

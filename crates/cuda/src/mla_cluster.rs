//! The absorbed MLA attention of a small decode step in one launch over thread-block clusters
//! (`kernels/mla_attn_cl.cu`): the W_UK projection, the token's latent row (kv_finish: norm,
//! RoPE, cache write), the decode over the paged cache, the LSE merge and W_UV, for steps of
//! one token a sequence — where [`Gpu::mla_q_absorb`], the split decode and
//! [`Gpu::mla_combine_uv`] are three dependent launches of a few memory round trips each.
//!
//! Invariants: a cluster of [`CLUSTER`] blocks serves one (token, head); block r owns latent
//! columns [64r, 64r + 64) of q_lat and o_lat, an eighth of the token's key list and V/8 output
//! rows, and the blocks hand each other their pieces in distributed shared memory (three
//! cluster barriers after the start-up one). The token's key list must hold no other token's
//! new row (one token a sequence; sequences share only full cache blocks), as for
//! `Early::TileButNew`: a block's first 80 rows but that one are copied before the kernel's PDL
//! wait. Unlike kv_finish and mla_q_absorb, it leaves `kv` unfinished and q_pe unrotated in `q`
//! (nothing reads them after it: the executor takes it only where no probe does). Latent row
//! 512 + 64 (DeepSeek-V2/V3, GLM-5), P <= 256, V <= 256 with V % 32 == 0; sm_90 or newer.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use crate::ops::{AttnDims, KeyLists, KvFinish};
use cudarc::driver::LaunchConfig;

/// Blocks a cluster (a (token, head)).
pub const CLUSTER: u32 = 8;
/// `sizeof(MacSmem)` in mla_attn_cl.cu (the kernel traps on less).
const SMEM: usize = 101_392;

/// The dynamic shared memory a block is launched with: [`SMEM`], or more where
/// `MLASERVE_ATTN_SMEM` (bytes, a lab knob) asks for it — above half an SM's 227 KB, two
/// blocks can no longer share an SM.
fn smem() -> usize {
    static S: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("MLASERVE_ATTN_SMEM")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(SMEM, |b| b.max(SMEM))
    })
}
/// Threads a block (MAC_THREADS).
const THREADS: u32 = 256;
const L: usize = 512;
const R: usize = 64;

/// Most (token, head) pairs of the default rule: 16, one V2-Lite token (128 blocks, one an
/// SM). Two tokens' 256 blocks take two waves; measured slower than the three launches at b2
/// (bench/cuda/v2lite.md, session 17).
const DEFAULT_MAX_PAIRS: usize = 16;
/// Most keys a token of the default rule: 2 chunks of 80 keys a block.
const DEFAULT_MAX_KEYS: usize = 1280;

/// The inputs and output of [`Gpu::mla_attn_cluster`] besides the shape.
#[derive(Clone, Copy)]
pub struct ClusterAttn<'a> {
    /// q [T, N*(P+R)] f32, q_pe not yet rotated.
    pub q: u64,
    /// cos / sin [T, R/2] f32 of each token's position.
    pub cos: u64,
    pub sin: u64,
    /// The tokens' latent rows, not yet finished, and where they go.
    pub kv: &'a KvFinish,
    /// W_UK^T [N, L, P] and W_UV [N, V, L] bf16.
    pub w_uk_t: u64,
    pub w_uv: u64,
    pub keys: &'a KeyLists,
    pub block_tables: u64,
    pub bt_off: u64,
    pub block_size: usize,
    /// out [T, N*V]: bf16 where `out_bf16`, else f32 = beta * out + attention.
    pub out: u64,
    pub out_bf16: bool,
    pub beta: f32,
}

/// `MLASERVE_CLUSTER_ATTN`: `0` never (the three launches, for comparisons), `all` wherever
/// the kernel takes the shape, anything else the default rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Knob {
    Off,
    Default,
    All,
}

fn knob() -> Knob {
    static K: std::sync::OnceLock<Knob> = std::sync::OnceLock::new();
    *K.get_or_init(|| match std::env::var("MLASERVE_CLUSTER_ATTN").as_deref() {
        Ok("0") => Knob::Off,
        Ok("all") => Knob::All,
        _ => Knob::Default,
    })
}

/// The default rule: small steps (≤ [`DEFAULT_MAX_PAIRS`] (token, head) pairs) over short
/// lists (≤ [`DEFAULT_MAX_KEYS`] keys), where the launches it replaces are latency-bound.
pub fn default_rule(t: usize, heads: usize, max_keys: usize) -> bool {
    t * heads <= DEFAULT_MAX_PAIRS && max_keys <= DEFAULT_MAX_KEYS
}

impl Gpu {
    /// Whether [`Gpu::mla_attn_cluster`] takes shape `d` on this GPU: the kernel's bounds and
    /// its clusters schedulable here.
    pub fn mla_attn_cluster_fits(&self, d: &AttnDims) -> bool {
        d.l == L
            && d.r == R
            && d.p.is_multiple_of(8)
            && (8..=256).contains(&d.p)
            && d.v.is_multiple_of(32)
            && (32..=256).contains(&d.v)
            && d.t * d.heads * CLUSTER as usize <= i32::MAX as usize
            && self.clusters_fit_smem("mla_attn_cl", CLUSTER, THREADS, smem())
    }

    /// Whether a one-token-a-sequence step of shape `d` over lists of at most `max_keys` keys
    /// runs [`Gpu::mla_attn_cluster`] (the default rule, `MLASERVE_CLUSTER_ATTN`).
    pub fn mla_attn_cluster_picked(&self, d: &AttnDims, max_keys: usize) -> bool {
        let rule = match knob() {
            Knob::Off => return false,
            Knob::All => true,
            Knob::Default => default_rule(d.t, d.heads, max_keys),
        };
        rule && self.mla_attn_cluster_fits(d)
    }

    /// The absorbed attention of `d.t` tokens, one a sequence, in one launch: kv_finish of
    /// each token's latent row (into the cache), q_lat = W_UK·bf16(q_nope), the decode over
    /// the paged cache with q_pe rotated, and W_UV·bf16(o_lat) into `a.out`.
    pub fn mla_attn_cluster(&self, d: &AttnDims, a: &ClusterAttn) -> Result<()> {
        if !self.mla_attn_cluster_fits(d) {
            return Err(CudaError::Invalid(format!(
                "mla_attn_cl: needs sm_90 clusters of {CLUSTER}, a latent row of {L}+{R}, \
                 qk_nope % 8 == 0 and <= 256, v_head % 32 == 0 and <= 256; got {}+{}, P {}, V \
                 {}, T {} x {} heads on {}",
                d.l, d.r, d.p, d.v, d.t, d.heads, self.arch
            )));
        }
        if a.block_size == 0 {
            return Err(CudaError::Invalid("mla_attn_cl: block size 0".into()));
        }
        let cfg = LaunchConfig {
            grid_dim: ((d.t * d.heads) as u32 * CLUSTER, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem() as u32,
        };
        let (ks, nh, p, v, bs) = (
            a.kv.ks as i32,
            d.heads as i32,
            d.p as i32,
            d.v as i32,
            a.block_size as i32,
        );
        let (out_b, out_f) = match a.out_bf16 {
            true => (a.out, 0u64),
            false => (0u64, a.out),
        };
        let k = a.keys;
        self.launch_cluster(
            "mla_attn_cl",
            cfg,
            CLUSTER,
            &args![
                a.q,
                a.cos,
                a.sin,
                a.kv.kv,
                ks,
                a.kv.w,
                a.kv.eps,
                a.kv.slots,
                a.kv.cache,
                a.w_uk_t,
                a.w_uv,
                nh,
                p,
                v,
                k.n_keys,
                k.sel_off,
                k.sel_pos,
                a.block_tables,
                a.bt_off,
                bs,
                d.scale,
                out_b,
                out_f,
                a.beta
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rule_takes_small_steps_over_short_lists() {
        assert!(default_rule(1, 16, 513));
        assert!(default_rule(1, 16, 1280));
        assert!(!default_rule(2, 16, 513));
        assert!(!default_rule(4, 16, 513));
        assert!(!default_rule(1, 128, 513));
        assert!(!default_rule(1, 16, 4096));
    }

    #[test]
    fn the_kernel_is_loaded() {
        assert!(crate::kernels::NAMES.contains(&"mla_attn_cl"));
    }
}

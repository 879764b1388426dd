//! The op set: one typed method per kernel, plus the cuBLAS GEMMs. Shapes are row-major;
//! `bf16` buffers hold bit patterns (`u16`). Each method only enqueues work on the stream.
//!
//! GEMM convention (the model's): `out[M, N] = x[M, K] · w[N, K]^T`, weights stored
//! [out_features, in_features] like every model matrix, f32 accumulation. cuBLAS is
//! column-major, so this is `out^T = w · x^T` with `op(w) = T`.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use cudarc::cublas::{result as blas, sys};
use std::ffi::c_void;

pub type Bf16 = u16;

fn grid1(n: usize) -> (u32, u32, u32) {
    (n as u32, 1, 1)
}

fn stride_grid(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1)
}

/// `MLASERVE_PICK_CLUSTER` as a number (read once; an unreadable value is said and ignored).
fn forced_pick_cluster() -> Option<u32> {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let v = std::env::var("MLASERVE_PICK_CLUSTER").ok()?;
        let c = v.trim().parse::<u32>().ok().filter(|&c| c <= 8);
        if c.is_none() {
            tracing::warn!("MLASERVE_PICK_CLUSTER={v:?} is not 0-8: ignored");
        }
        c
    })
}

/// Element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmType {
    /// bf16 operands, f32 output.
    Bf16,
    /// f32 operands, f32 output.
    F32,
    /// bf16 operands, bf16 output (f32 accumulation, rounded once; `beta` must be 0).
    Bf16Out,
}

impl GemmType {
    /// The operands' type.
    fn cuda(self) -> sys::cudaDataType {
        match self {
            GemmType::Bf16 | GemmType::Bf16Out => sys::cudaDataType::CUDA_R_16BF,
            GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
        }
    }

    /// The output's type.
    fn cuda_out(self) -> sys::cudaDataType {
        match self {
            GemmType::Bf16Out => sys::cudaDataType::CUDA_R_16BF,
            GemmType::Bf16 | GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
        }
    }
}

/// One (possibly strided-batched) GEMM: for b in 0..batch,
/// `out_b[M, N] (ld ldo) = alpha · x_b[M, K] (ld ldx) · w_b[N, K]^T (ld ldw) + beta · out_b`,
/// operand b at `ptr + b * stride` elements. Output f32 (bf16 for [`GemmType::Bf16Out`]).
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ty: GemmType,
    pub x: u64,
    pub ldx: usize,
    pub stride_x: usize,
    pub w: u64,
    pub ldw: usize,
    pub stride_w: usize,
    pub out: u64,
    pub ldo: usize,
    pub stride_o: usize,
    pub batch: usize,
    pub beta: f32,
}

impl Gemm {
    /// Plain `out[M, N] = x[M, K] · w[N, K]^T`, contiguous rows.
    pub fn plain(ty: GemmType, m: usize, n: usize, k: usize, x: u64, w: u64, out: u64) -> Self {
        Gemm {
            m,
            n,
            k,
            ty,
            x,
            ldx: k,
            stride_x: 0,
            w,
            ldw: k,
            stride_w: 0,
            out,
            ldo: n,
            stride_o: 0,
            batch: 1,
            beta: 0.0,
        }
    }

    pub fn accumulate(mut self) -> Self {
        self.beta = 1.0;
        self
    }
}

impl Gpu {
    pub fn gemm(&self, g: &Gemm) -> Result<()> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        if g.k == 0 {
            return Err(CudaError::Invalid("GEMM with k = 0".into()));
        }
        if g.ty == GemmType::Bf16Out && g.beta != 0.0 {
            return Err(CudaError::Invalid(
                "a GEMM with bf16 output cannot accumulate (beta != 0)".into(),
            ));
        }
        let out_ty = g.ty.cuda_out();
        let alpha = 1f32;
        let ty = g.ty.cuda();
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let err = |e: cudarc::cublas::result::CublasError| CudaError::Cublas {
            op: format!("gemm m={} n={} k={} batch={}", g.m, g.n, g.k, g.batch),
            msg: format!("{e:?}"),
        };
        // SAFETY: pointers come from live DBufs sized by the caller for these shapes.
        unsafe {
            if g.batch == 1 {
                blas::gemm_ex(
                    self.blas(),
                    sys::cublasOperation_t::CUBLAS_OP_T,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    &alpha as *const f32 as *const c_void,
                    g.w as *const c_void,
                    ty,
                    g.ldw as i32,
                    g.x as *const c_void,
                    ty,
                    g.ldx as i32,
                    &g.beta as *const f32 as *const c_void,
                    g.out as *mut c_void,
                    out_ty,
                    g.ldo as i32,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(err)
            } else {
                blas::gemm_strided_batched_ex(
                    self.blas(),
                    sys::cublasOperation_t::CUBLAS_OP_T,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    &alpha as *const f32 as *const c_void,
                    g.w as *const c_void,
                    ty,
                    g.ldw as i32,
                    g.stride_w as i64,
                    g.x as *const c_void,
                    ty,
                    g.ldx as i32,
                    g.stride_x as i64,
                    &g.beta as *const f32 as *const c_void,
                    g.out as *mut c_void,
                    out_ty,
                    g.ldo as i32,
                    g.stride_o as i64,
                    g.batch as i32,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(err)
            }
        }?;
        if !self.profiling() {
            return Ok(());
        }
        let batch = if g.batch > 1 {
            format!(" x{}", g.batch)
        } else {
            String::new()
        };
        self.prof_mark(&format!("gemm {}x{}x{}{batch}", g.m, g.n, g.k))
    }

    /// x[t, :] = table[tokens[t], :] as f32.  table [V, h] bf16, tokens [T], x [T, h].
    pub fn embed(&self, table: &DBuf<Bf16>, tokens: &DBuf<u32>, x: u64, h: usize) -> Result<()> {
        let (tp, kp, h32) = (table.ptr(), tokens.ptr(), h as i32);
        self.launch(
            "embed_bf16",
            Gpu::cfg(grid1(tokens.len()), 256),
            &args![tp, kp, x, h32],
        )
    }

    /// dst[m, :] = src[idx[m], :], f32 rows of n; idx [M] i32.
    pub fn gather_rows_f32(&self, src: u64, idx: u64, m: usize, dst: u64, n: usize) -> Result<()> {
        let n = n as i32;
        self.launch(
            "gather_rows_f32",
            Gpu::cfg(grid1(m), 256),
            &args![src, idx, dst, n],
        )
    }

    /// dst[idx[m], :] += src[m, :] (distinct idx), f32 rows of n.
    pub fn add_rows_indexed(&self, dst: u64, src: u64, idx: u64, m: usize, n: usize) -> Result<()> {
        let n = n as i32;
        self.launch(
            "add_rows_indexed",
            Gpu::cfg(grid1(m), 256),
            &args![dst, src, idx, n],
        )
    }

    /// x[i] += y[i] for n f32 elements.
    pub fn add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let n64 = n as i64;
        self.launch("add_f32", Gpu::cfg(stride_grid(n), 256), &args![x, y, n64])
    }

    /// y[i] = bf16(x[i]) for n elements.
    pub fn to_bf16(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let n64 = n as i64;
        self.launch(
            "f32_to_bf16",
            Gpu::cfg(stride_grid(n), 256),
            &args![x, y, n64],
        )
    }

    /// RMSNorm of `rows` rows (n wide, stride xs; `rows_idx` picks input rows, 0 = identity)
    /// times w, to f32 `out` (stride os) and/or bf16 `outb` (stride obs); 0 = not written.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        rows: usize,
        x: u64,
        xs: usize,
        rows_idx: u64,
        w: u64,
        out: u64,
        os: usize,
        outb: u64,
        obs: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let (xs, os, obs, n) = (xs as i32, os as i32, obs as i32, n as i32);
        self.launch(
            "rms_norm",
            Gpu::cfg(grid1(rows), 256),
            &args![x, xs, rows_idx, w, out, os, outb, obs, n, eps],
        )
    }

    /// Each of `rows` logits rows (`[rows, vocab]` f32 at `logits`) reduced to its token
    /// (`mlaserve_model::RowPick::of`; pick.cu): `out` holds `rows` x 4 u32, each row's
    /// `RowArgmax` as [token, max bits, first bad index or u32::MAX, its bits]; `picked` `rows`
    /// u32, the token each row's draw chose. `draws`: 0 (every row greedy) or `rows` x 8 u32
    /// [1/temperature bits, random low word, random high word, 1 (0: greedy), top_k, top_p
    /// bits, min_p bits, 0] (the executor's `draw_words`); a row drawn with a filter is
    /// overwritten with its probabilities. `logits`
    /// 16-byte aligned when `vocab % 4 == 0` (the kernel loads float4s; arena and driver
    /// allocations are). Each row is one block's, or at few rows a cluster's
    /// ([`Gpu::pick_cluster`]).
    pub fn logits_pick(
        &self,
        rows: usize,
        logits: u64,
        vocab: usize,
        draws: u64,
        out: u64,
        picked: u64,
    ) -> Result<()> {
        let c = self.pick_cluster(rows, vocab);
        self.logits_pick_in(c, rows, logits, vocab, draws, out, picked)
    }

    /// [`Gpu::logits_pick`] with `cluster` blocks a row (0 or 1: a block a row; 2-8: clusters,
    /// where [`Gpu::clusters_fit`]).
    #[allow(clippy::too_many_arguments)]
    pub fn logits_pick_in(
        &self,
        cluster: u32,
        rows: usize,
        logits: u64,
        vocab: usize,
        draws: u64,
        out: u64,
        picked: u64,
    ) -> Result<()> {
        let vocab = vocab as i32;
        let cfg = Gpu::cfg(grid1(rows * cluster as usize), 1024);
        let args = args![logits, vocab, draws, out, picked];
        if cluster <= 1 {
            return self.launch("logits_pick", cfg, &args);
        }
        if !self.clusters_fit("logits_pick", cluster, 1024) {
            return Err(CudaError::Invalid(format!(
                "logits_pick: clusters of {cluster} blocks of 1024 threads do not fit on {}",
                self.arch
            )));
        }
        self.launch_cluster("logits_pick", cfg, cluster, &args)
    }

    /// Blocks a row for [`Gpu::logits_pick`]: one block's passes over a row of 102,400
    /// tokens take ~40 µs for a draw at a temperature and ~130-230 µs under top-k / top-p
    /// (bench/cuda/v2lite.md, session 33), so where the rows leave SMs idle each row is split
    /// over a cluster of 8, 4 or 2 blocks (the most with `rows x C` within the SMs), for rows
    /// of 8,192 tokens and more. `MLASERVE_PICK_CLUSTER`: 1 (or 0) a block a row, 2-8 that
    /// size wherever it fits (else a block a row).
    pub fn pick_cluster(&self, rows: usize, vocab: usize) -> u32 {
        let fits = |c: u32| self.clusters_fit("logits_pick", c, 1024);
        match forced_pick_cluster() {
            Some(c @ 2..=8) => return if fits(c) { c } else { 1 },
            Some(_) => return 1,
            None => {}
        }
        if vocab < 8192 || !self.has_clusters() {
            return 1;
        }
        [8, 4, 2]
            .into_iter()
            .find(|&c| rows * c as usize <= self.sm_count && fits(c))
            .unwrap_or(1)
    }

    /// LayerNorm (weight w, bias b) of `rows` rows of n (stride xs) in place.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        rows: usize,
        x: u64,
        xs: usize,
        w: u64,
        bias: u64,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let (xs, n) = (xs as i32, n as i32);
        self.launch(
            "layer_norm",
            Gpu::cfg(grid1(rows), 128),
            &args![x, xs, w, bias, n, eps],
        )
    }

    /// Interleaved RoPE in place on `rows` tokens: n_heads heads of r values at
    /// x + t*row_stride + h*head_stride + offset; cos/sin tables [rows, r/2].
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        rows: usize,
        x: u64,
        row_stride: usize,
        n_heads: usize,
        head_stride: usize,
        offset: usize,
        r: usize,
        cos: u64,
        sin: u64,
    ) -> Result<()> {
        let (rs, nh, hs, off, r) = (
            row_stride as i32,
            n_heads as i32,
            head_stride as i32,
            offset as i32,
            r as i32,
        );
        self.launch(
            "rope_interleaved",
            Gpu::cfg(grid1(rows), 128),
            &args![x, rs, nh, hs, off, r, cos, sin],
        )
    }

    /// The queries of `rows` tokens finished for the absorbed path in one kernel: q [rows,
    /// width] f32 (row stride `width`) RoPE'd in place like [`Gpu::rope`] (heads `n_heads`
    /// apart by `head_stride`, pairs from `offset`, `r` wide), then qb = bf16(q) [rows, width]
    /// — bit-identical to [`Gpu::rope`] then [`Gpu::to_bf16`]. `r` is even.
    #[allow(clippy::too_many_arguments)]
    pub fn q_finish(
        &self,
        rows: usize,
        q: u64,
        width: usize,
        n_heads: usize,
        head_stride: usize,
        offset: usize,
        r: usize,
        cos: u64,
        sin: u64,
        qb: u64,
    ) -> Result<()> {
        if !r.is_multiple_of(2) || n_heads * head_stride > width || offset + r > head_stride {
            return Err(CudaError::Invalid(format!(
                "q_finish: rope width {r} at {offset} of {n_heads} heads {head_stride} apart \
                 in rows of {width}"
            )));
        }
        let (w, nh, hs, off, r) = (
            width as i32,
            n_heads as i32,
            head_stride as i32,
            offset as i32,
            r as i32,
        );
        self.launch(
            "q_finish",
            Gpu::cfg(grid1(rows), 256),
            &args![q, w, nh, hs, off, r, cos, sin, qb],
        )
    }

    /// out[t, i] = bf16(silu(gu[t, i]) * gu[t, f + i]); gu [rows, 2f] f32, out [rows, f].
    pub fn silu_mul(&self, gu: u64, out: u64, f: usize, rows: usize) -> Result<()> {
        let (f32_, r64) = (f as i32, rows as i64);
        self.launch(
            "silu_mul_bf16",
            Gpu::cfg(stride_grid(rows * f), 256),
            &args![gu, out, f32_, r64],
        )
    }

    /// dst[m, :] = src[idx[m], :], bf16 rows of n; idx [M] i32.
    pub fn gather_rows(&self, src: u64, idx: u64, m: usize, dst: u64, n: usize) -> Result<()> {
        let n = n as i32;
        self.launch(
            "gather_rows_bf16",
            Gpu::cfg(grid1(m), 256),
            &args![src, idx, dst, n],
        )
    }

    /// x[t, :] += sum_j w[t, j] * y[rows[t, j], :]; rows/w [T, k] (rows < 0 skipped).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        t: usize,
        x: u64,
        y: u64,
        rows: u64,
        w: u64,
        k: usize,
        h: usize,
    ) -> Result<()> {
        let (k, h) = (k as i32, h as i32);
        self.launch(
            "moe_combine",
            Gpu::cfg(grid1(t), 256),
            &args![x, y, rows, w, k, h],
        )
    }

    /// cache[slots[t], :] = bf16(kv[t, :w]) (kv row stride ks); slots [T] i64.
    pub fn cache_write_bf16(
        &self,
        t: usize,
        kv: u64,
        ks: usize,
        slots: u64,
        cache: u64,
        w: usize,
    ) -> Result<()> {
        let (ks, w) = (ks as i32, w as i32);
        self.launch(
            "cache_write_bf16",
            Gpu::cfg(grid1(t), 256),
            &args![kv, ks, slots, cache, w],
        )
    }

    /// The latent rows of `t` tokens finished and cached in one kernel: kv [T, l+r] (row
    /// stride ks) in place, kv_c RMSNorm'd times w, k_pe rotated (interleaved RoPE by cos/sin
    /// [T, r/2]), then cache[slots[t], :] = bf16(row) — bit-identical to [`Gpu::rms_norm`],
    /// [`Gpu::rope`] and [`Gpu::cache_write_bf16`] in turn. `r` is even (RoPE pairs).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_finish(
        &self,
        t: usize,
        kv: u64,
        ks: usize,
        w: u64,
        l: usize,
        r: usize,
        eps: f32,
        cos: u64,
        sin: u64,
        slots: u64,
        cache: u64,
    ) -> Result<()> {
        if !r.is_multiple_of(2) {
            return Err(CudaError::Invalid(format!(
                "kv_finish: qk_rope_head_dim {r} is odd (RoPE rotates pairs)"
            )));
        }
        let (ks, l, r) = (ks as i32, l as i32, r as i32);
        self.launch(
            "kv_finish",
            Gpu::cfg(grid1(t), 256),
            &args![kv, ks, w, l, r, eps, cos, sin, slots, cache],
        )
    }

    /// cache[slots[t], :] = kv[t, :w] in f32.
    pub fn cache_write_f32(
        &self,
        t: usize,
        kv: u64,
        ks: usize,
        slots: u64,
        cache: u64,
        w: usize,
    ) -> Result<()> {
        let (ks, w) = (ks as i32, w as i32);
        self.launch(
            "cache_write_f32",
            Gpu::cfg(grid1(t), 256),
            &args![kv, ks, slots, cache, w],
        )
    }

    /// Rows of `slots` [S] from the latent cache (width w): [0, l) to kvc [S, l] bf16,
    /// [l, w) to kpe [S, w - l] f32.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_latent(
        &self,
        s: usize,
        cache: u64,
        slots: u64,
        w: usize,
        l: usize,
        kvc: u64,
        kpe: u64,
    ) -> Result<()> {
        let (w, l) = (w as i32, l as i32);
        self.launch(
            "gather_latent",
            Gpu::cfg(grid1(s), 256),
            &args![cache, slots, w, l, kvc, kpe],
        )
    }
}

/// Per-query key lists, on the device (see attention.cu): counts, CSR offsets (-1 = dense
/// 0..n), positions, and where each query's keys live.
pub struct KeyLists {
    /// [T] number of keys of each query.
    pub n_keys: u64,
    /// [T] offset into `sel_pos`, or -1 for dense causal.
    pub sel_off: u64,
    /// [sum of selected] positions, ascending per query.
    pub sel_pos: u64,
}

/// MLA dimensions of one attention launch.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub t: usize,
    pub heads: usize,
    pub p: usize,
    pub r: usize,
    pub v: usize,
    pub l: usize,
    pub scale: f32,
}

impl Gpu {
    /// Unabsorbed attention: q [T, N*(P+R)], k_nope [S, N*P], kpe [S, R] f32, v [S, N*V],
    /// out [T, N*V]; query t's key position p is row kv_base[t] + p.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_mha(
        &self,
        d: &AttnDims,
        q: u64,
        k_nope: u64,
        kpe: u64,
        v: u64,
        out: u64,
        keys: &KeyLists,
        kv_base: u64,
    ) -> Result<()> {
        if d.p + d.r > 1024 || d.v > 1024 {
            return Err(CudaError::Invalid(format!(
                "attention head dims qk={} v={} exceed the kernel's 1024",
                d.p + d.r,
                d.v
            )));
        }
        let (nh, p, r, vd) = (d.heads as i32, d.p as i32, d.r as i32, d.v as i32);
        let (nk, so, sp, scale) = (keys.n_keys, keys.sel_off, keys.sel_pos, d.scale);
        self.launch(
            "attn_mha",
            Gpu::cfg((d.t as u32, d.heads as u32, 1), 128),
            &args![q, k_nope, kpe, v, out, nk, so, sp, kv_base, nh, p, r, vd, scale],
        )
    }

    /// Absorbed attention over the paged cache, split over the keys in `splits` parts and
    /// LSE-combined: q_lat [T, N, L] f32, q [T, N*(P+R)] (rope part read), cache [slots, L+R]
    /// bf16 → o_lat [T, N, L] bf16. `part` [T*N*splits*L] and `lse` [T*N*splits] are scratch
    /// (o_lat 0: no combine; the caller reads them, [`Gpu::mla_combine_uv`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attn_mqa(
        &self,
        d: &AttnDims,
        q_lat: u64,
        q: u64,
        cache: u64,
        keys: &KeyLists,
        block_tables: u64,
        bt_off: u64,
        block_size: usize,
        splits: usize,
        part: u64,
        lse: u64,
        o_lat: u64,
    ) -> Result<()> {
        if d.l + d.r > 1152 || d.l > 1024 {
            return Err(CudaError::Invalid(format!(
                "latent row {}+{} exceeds the kernel's limit",
                d.l, d.r
            )));
        }
        let (nh, p, r, l) = (d.heads as i32, d.p as i32, d.r as i32, d.l as i32);
        let (nk, so, sp, scale, bs) = (
            keys.n_keys,
            keys.sel_off,
            keys.sel_pos,
            d.scale,
            block_size as i32,
        );
        self.launch(
            "attn_mqa_split",
            Gpu::cfg((d.t as u32, d.heads as u32, splits as u32), 128),
            &args![
                q_lat,
                q,
                cache,
                part,
                lse,
                nk,
                so,
                sp,
                block_tables,
                bt_off,
                bs,
                nh,
                p,
                r,
                l,
                scale
            ],
        )?;
        if o_lat == 0 {
            return Ok(());
        }
        let ns = splits as i32;
        self.launch(
            "attn_mqa_combine",
            Gpu::cfg(grid1(d.t * d.heads), 256),
            &args![part, lse, o_lat, ns, l],
        )
    }

    /// The absorbed path's q side in one launch: q_lat [T, N, L] f32 = W_UK_T[h] ·
    /// bf16(q_nope) per head, w_uk_t [N, L, P] bf16, q [T, N*(P+R)] f32; with `rope` (cos,
    /// sin [T, R/2]) q_pe is also rotated in place (interleaved pairs, as [`Gpu::rope`]), and
    /// with `kv` as well the latent rows finished and cached in the same launch, exactly as
    /// [`Gpu::kv_finish`] (same cos/sin, L and R). P % 8 == 0, P <= 512.
    #[allow(clippy::too_many_arguments)]
    pub fn mla_q_absorb(
        &self,
        d: &AttnDims,
        q: u64,
        w_uk_t: u64,
        q_lat: u64,
        rope: Option<(u64, u64)>,
        kv: Option<&KvFinish>,
    ) -> Result<()> {
        if !d.p.is_multiple_of(8) || d.p > 512 || !d.r.is_multiple_of(2) {
            return Err(CudaError::Invalid(format!(
                "mla_q_absorb needs qk_nope % 8 == 0, <= 512 and an even rope width, got {} / {}",
                d.p, d.r
            )));
        }
        if kv.is_some() && rope.is_none() {
            return Err(CudaError::Invalid(
                "mla_q_absorb: the latent rows' kv_finish wants the step's RoPE tables".into(),
            ));
        }
        let (nh, qk, p, r, l) = (
            d.heads as i32,
            (d.p + d.r) as i32,
            d.p as i32,
            d.r as i32,
            d.l as i32,
        );
        let (cos, sin) = rope.unwrap_or((0, 0));
        // t_kv = 0: the kernel reads none of kv_finish's arguments.
        let (t_kv, kvp, ks, kw, eps, slots, cache) = match kv {
            Some(f) => (d.t, f.kv, f.ks as i32, f.w, f.eps, f.slots, f.cache),
            None => (0, 0, 0, 0, 0.0, 0, 0),
        };
        self.launch(
            "mla_q_absorb",
            Gpu::cfg(
                ((t_kv + d.t * d.heads) as u32, d.l.div_ceil(64) as u32, 1),
                256,
            ),
            &args![
                q,
                w_uk_t,
                q_lat,
                nh,
                qk,
                p,
                r,
                l,
                cos,
                sin,
                kvp,
                ks,
                kw,
                eps,
                slots,
                cache,
                t_kv as i32
            ],
        )
    }

    /// The absorbed path's output side in one launch: the LSE combine of the split decode's
    /// `part` [T, N, splits, L] / `lse` [T, N, splits] into bf16 o_lat (as the combine of
    /// [`Gpu::attn_mqa`]), then W_UV[h] · o_lat per head, w_uv [N, V, L] bf16, into out
    /// [T, N*V]: bf16 rows (`Bf16Out`-like) or f32 (= beta · out + product). L % 8 == 0,
    /// L <= 1024, splits <= 256.
    #[allow(clippy::too_many_arguments)]
    pub fn mla_combine_uv(
        &self,
        d: &AttnDims,
        part: u64,
        lse: u64,
        splits: usize,
        w_uv: u64,
        out: u64,
        out_bf16: bool,
        beta: f32,
    ) -> Result<()> {
        if !d.l.is_multiple_of(8) || d.l > 1024 || splits == 0 || splits > 256 {
            return Err(CudaError::Invalid(format!(
                "mla_combine_uv needs kv_lora_rank % 8 == 0 and <= 1024 and 1..=256 splits, got \
                 {} / {splits}",
                d.l
            )));
        }
        let (ns, l, nh, v) = (splits as i32, d.l as i32, d.heads as i32, d.v as i32);
        let (ob, of) = if out_bf16 { (out, 0u64) } else { (0u64, out) };
        self.launch(
            "mla_combine_uv",
            Gpu::cfg(((d.t * d.heads) as u32, d.v.div_ceil(16) as u32, 1), 256),
            &args![part, lse, w_uv, ns, l, nh, v, ob, of, beta],
        )
    }

    /// DSA indexer scores [T, max_keys] over dense key lists (n_keys[t] = pos + 1):
    /// iq [T, hi*d], wt [T, hi] (times hi^-0.5 here), kcache [slots, d] f32.
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_scores(
        &self,
        t: usize,
        iq: u64,
        wt: u64,
        kcache: u64,
        scores: u64,
        n_keys: u64,
        block_tables: u64,
        bt_off: u64,
        block_size: usize,
        hi: usize,
        d: usize,
        max_keys: usize,
    ) -> Result<()> {
        if max_keys.div_ceil(4) > 65_535 {
            return Err(CudaError::Invalid(format!(
                "DSA indexer over {max_keys} keys: the scores kernel's grid covers at most 262,140"
            )));
        }
        let (bs, hi32, d32, mk) = (block_size as i32, hi as i32, d as i32, max_keys as i32);
        let d_scale = (d as f32).powf(-0.5);
        let w_scale = (hi as f32).powf(-0.5);
        self.launch(
            "dsa_scores",
            Gpu::cfg((t as u32, max_keys.div_ceil(4) as u32, 1), 128),
            &args![
                iq,
                wt,
                kcache,
                scores,
                n_keys,
                block_tables,
                bt_off,
                bs,
                hi32,
                d32,
                d_scale,
                w_scale,
                mk
            ],
        )
    }
}

/// Where the expert table of the fused expert kernels holds shared-expert slices as views
/// (weights.rs, `GMoe::slices`): entries from id `e_routed` on are slices of one shared MLP of
/// intermediate `fs` — gate|up entries at the slice's gate row of the shared [2fs, n] (its up
/// rows `fs` further), down entries at its first column of the shared [rows, fs].
#[derive(Clone, Copy, Debug)]
pub struct SliceViews {
    pub e_routed: usize,
    pub fs: usize,
}

impl SliceViews {
    /// No slices: every id is a routed expert.
    pub const NONE: SliceViews = SliceViews {
        e_routed: i32::MAX as usize,
        fs: 0,
    };

    pub(crate) fn args(self) -> (i32, i32) {
        (self.e_routed.min(i32::MAX as usize) as i32, self.fs as i32)
    }

    /// Whether any id names a slice (`NONE` marks none with e_routed = i32::MAX).
    pub(crate) fn has_slices(self) -> bool {
        self.e_routed < i32::MAX as usize
    }
}

/// Routing rules of a MoE layer, as the kernel takes them.
#[derive(Clone, Copy, Debug)]
pub struct RouteCfg {
    pub experts: usize,
    pub top_k: usize,
    /// 0 softmax, 1 sigmoid.
    pub gating: i32,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm: bool,
    pub scale: f32,
    /// Shared-expert slices appended to every token's slots (ids E + j, weight 1).
    pub shared: usize,
}

/// [`Gpu::kv_finish`]'s arguments other than the token count, L, R and the RoPE tables, for
/// [`Gpu::mla_q_absorb`] to finish the latent rows in its own launch: kv [T, L+R] f32 (row
/// stride `ks`), the norm's weight `w` [L], `eps`, slots [T] i64 and the layer's cache.
#[derive(Clone, Copy, Debug)]
pub struct KvFinish {
    pub kv: u64,
    pub ks: usize,
    pub w: u64,
    pub eps: f32,
    pub slots: u64,
    pub cache: u64,
}

/// `moe_norm_route_cl`'s `late` bits (read once): 1 `MLASERVE_ROUTE_LATE`, 2
/// `MLASERVE_ROUTE_RANK`, both on unless set to 0 (`Gpu::moe_norm_route_with`).
fn route_late_bits() -> i32 {
    static LATE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *LATE.get_or_init(|| {
        let on = |k: &str| std::env::var(k).map_or(true, |v| v != "0");
        on("MLASERVE_ROUTE_LATE") as i32 | (on("MLASERVE_ROUTE_RANK") as i32) << 1
    })
}

/// Whether [`Gpu::moe_gemv_combine_after`] loads weights before its wait where the caller
/// allows it (`MLASERVE_COMBINE_EARLY=0`: never, for comparisons).
fn combine_early() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_COMBINE_EARLY").map_or(true, |v| v != "0"))
}

/// Whether the fused expert kernels (`moe_gemv_swiglu`, `moe_gemv_combine`) copy the expert
/// pointer table into shared memory before their wait (moe.cu's `stage_table`; 1 or 0 as the
/// kernels take it). `MLASERVE_MOE_TABLE=0`: never, for comparisons.
fn moe_table() -> i32 {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_MOE_TABLE").map_or(true, |v| v != "0")) as i32
}

impl RouteCfg {
    /// The routing kernels' arguments (E, K, shared slices, gating, groups, top groups, norm,
    /// scale), or an error naming what their shared arrays cannot hold.
    #[allow(clippy::type_complexity)]
    fn kernel_args(&self) -> Result<(i32, i32, i32, i32, i32, i32, i32, f32)> {
        if self.experts == 0 || self.experts > 1024 || self.n_group > 64 || self.shared > 256 {
            return Err(CudaError::Invalid(format!(
                "GPU routing takes 1..=1024 experts, <= 64 groups and <= 256 shared slices, \
                 got {} / {} / {}",
                self.experts, self.n_group, self.shared
            )));
        }
        Ok((
            self.experts as i32,
            self.top_k as i32,
            self.shared as i32,
            self.gating,
            self.n_group as i32,
            self.topk_group as i32,
            self.norm as i32,
            self.scale,
        ))
    }
}

impl Gpu {
    /// Routing of `t` tokens: logits [T, E] f32 (+ optional bias [E]) -> ids [T, K + S] i32
    /// and weights [T, K + S] f32: the top-k best first, exactly the CPU `route` rules, then
    /// the `c.shared` shared-expert slices (ids E + j, weight 1).
    pub fn moe_route(
        &self,
        t: usize,
        logits: u64,
        bias: u64,
        c: &RouteCfg,
        ids: u64,
        weights: u64,
    ) -> Result<()> {
        let (e, k, ns, g, ng, tg, norm, scale) = c.kernel_args()?;
        self.launch(
            "moe_route",
            Gpu::cfg(grid1(t), 256),
            &args![logits, bias, e, k, ns, g, ng, tg, norm, scale, ids, weights],
        )
    }

    /// The FFN norm, router and routing of `t` tokens in one launch: hnb [T, H] bf16 =
    /// RMSNorm(x [T, H] f32) * gamma (bit-identical to [`Gpu::rms_norm`]'s bf16 rows),
    /// logits [T, E] f32 = those rows (f32) . router [E, H] f32, then ids / weights
    /// [T, top_k + shared] as [`Gpu::moe_route`]. `tickets` [>= T] u32, zero, and zero again
    /// after the launch (the kernel resets them). The kernel: [`Gpu::route_cluster`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_norm_route(
        &self,
        t: usize,
        x: u64,
        gamma: u64,
        eps: f32,
        h: usize,
        router: u64,
        hnb: u64,
        logits: u64,
        tickets: &DBuf<u32>,
        bias: u64,
        c: &RouteCfg,
        ids: u64,
        weights: u64,
        fence_hnb: bool,
    ) -> Result<()> {
        let cluster = self.route_cluster(c, h);
        self.moe_norm_route_with(
            t, x, gamma, eps, h, router, hnb, logits, tickets, bias, c, ids, weights, cluster,
            fence_hnb,
        )
    }

    /// The clusters [`Gpu::moe_norm_route`] runs on: `Some(8)` where the cluster kernel
    /// (`moe_norm_route_cl`: logits handed over in distributed shared memory, no global
    /// ticket) can take the shape and its 8 blocks a token read at most 128 KB of router each
    /// (E x H <= 262,144: DeepSeek-V2-Lite's 64 x 2,048, not V3's 256 x 7,168, whose router
    /// wants the ticket kernel's E blocks a token); `None`: the ticket kernel.
    /// `MLASERVE_CLUSTER_ROUTE=0`: always the ticket kernel, for comparisons.
    pub fn route_cluster(&self, c: &RouteCfg, h: usize) -> Option<u32> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on =
            *ON.get_or_init(|| std::env::var("MLASERVE_CLUSTER_ROUTE").map_or(true, |v| v != "0"));
        (on && c.experts * h <= 262_144 && self.route_cluster_fits(c, h, 8)).then_some(8)
    }

    /// Whether `moe_norm_route_cl` takes this routing in clusters of `cluster` blocks (its
    /// bounds, moe.cu, and clusters of that size schedulable on this GPU).
    pub fn route_cluster_fits(&self, c: &RouteCfg, h: usize, cluster: usize) -> bool {
        (1..=8).contains(&cluster)
            && self.clusters_fit("moe_norm_route_cl", cluster as u32, 256)
            && c.experts.is_multiple_of(cluster)
            && c.experts <= 256
            && c.top_k <= 32
            && c.shared <= 32
            && c.n_group <= 64
            && h.is_multiple_of(4)
            && h <= 8192
    }

    /// [`Gpu::moe_norm_route`] on the ticket kernel (`cluster` None) or the cluster kernel
    /// in clusters of that many blocks (an error where [`Gpu::route_cluster_fits`] says no).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_norm_route_with(
        &self,
        t: usize,
        x: u64,
        gamma: u64,
        eps: f32,
        h: usize,
        router: u64,
        hnb: u64,
        logits: u64,
        tickets: &DBuf<u32>,
        bias: u64,
        c: &RouteCfg,
        ids: u64,
        weights: u64,
        cluster: Option<u32>,
        fence_hnb: bool,
    ) -> Result<()> {
        let (e, k, ns, g, ng, tg, norm, scale) = c.kernel_args()?;
        let h32 = h as i32;
        if let Some(cl) = cluster {
            if !self.route_cluster_fits(c, h, cl as usize) {
                return Err(CudaError::Invalid(format!(
                    "moe_norm_route_cl: {} experts (top {}, {} shared, {} groups), hidden {h} \
                     in clusters of {cl} on {}",
                    c.experts, c.top_k, c.shared, c.n_group, self.arch
                )));
            }
            // The expert GEMV after it is launched once the logits are in (`late`), not at
            // the wait: its ~1,400 blocks arriving early slowed the routing (V2-Lite b1 on the
            // H200, session 20: 1,898.0 / 1,899.1 µs a step against 1,920.8 / 1,921.5).
            // `MLASERVE_ROUTE_LATE=0`: at the wait, for comparisons.
            // Bit 1: the top-k by rank over block 0's 256 threads (route_row_rank: the same
            // ids and weights) instead of one warp's k argmax rounds (route_row_warp, still
            // taken for group-limited routing): V2-Lite b1 1,888.2-1,888.8 µs a step against
            // 1,894.7-1,895.7 in three rounds (session 21). `MLASERVE_ROUTE_RANK=0`: the warp's
            // rounds, for comparisons.
            // Bit 2 (`fence_hnb`, with bit 0 only): block 0 fences hnb at gpu scope before
            // letting the next kernel in, for an expert GEMV whose shared slices skip their
            // wait ([`Gpu::shared_nowait`]).
            let late = route_late_bits();
            let late = late | if fence_hnb && late & 1 != 0 { 4 } else { 0 };
            return self.launch_cluster(
                "moe_norm_route_cl",
                Gpu::cfg((cl, t as u32, 1), 256),
                cl,
                &args![
                    x, gamma, eps, h32, router, hnb, logits, bias, e, k, ns, g, ng, tg, norm,
                    scale, ids, weights, late
                ],
            );
        }
        if t > tickets.len() {
            return Err(CudaError::Invalid(format!(
                "moe_norm_route: {t} tokens, {} tickets",
                tickets.len()
            )));
        }
        let tickets = tickets.ptr();
        self.launch(
            "moe_norm_route",
            Gpu::cfg((c.experts as u32, t as u32, 1), 256),
            &args![
                x, gamma, eps, h32, router, hnb, logits, tickets, bias, e, k, ns, g, ng, tg, norm,
                scale, ids, weights
            ],
        )
    }

    /// out[p, r] = W_{ids[p]}[r, :] . x[p / x_div, :] for `pairs` pairs; W bf16 [rows, n] found
    /// in the per-expert pointer table `w_ptrs` (index `ids[p] - first`, `held` entries).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemv(
        &self,
        pairs: usize,
        w_ptrs: u64,
        first: usize,
        held: usize,
        ids: u64,
        x: u64,
        x_div: usize,
        n: usize,
        rows: usize,
        out: u64,
    ) -> Result<()> {
        if !n.is_multiple_of(8) {
            return Err(CudaError::Invalid(format!(
                "moe_gemv needs n % 8 == 0, got {n}"
            )));
        }
        let (f, hd, xd, n32, r32) = (
            first as i32,
            held as i32,
            x_div as i32,
            n as i32,
            rows as i32,
        );
        self.launch(
            "moe_gemv",
            Gpu::cfg((rows.div_ceil(8) as u32, pairs as u32, 1), 256),
            &args![w_ptrs, f, hd, ids, x, xd, n32, r32, out],
        )
    }

    /// act[p, i] = bf16(silu(g) * u), g|u = W_{ids[p]} [2f, n] . x[p / x_div, :], for `pairs`
    /// pairs: [`Gpu::moe_gemv`] over 2f rows then [`Gpu::silu_mul`], bit for bit, in one
    /// kernel. Ids from `views.e_routed` on are shared-expert slices ([`SliceViews`]).
    /// `k_routed` < `x_div` (pairs = tokens * x_div): each token's pairs from `k_routed` on are
    /// the slices (ids `e_routed + j`, as the routing writes them), whose blocks run first
    /// and load their first weights before the previous kernel ends (kernels/moe.cu; a pair
    /// whose id differs is computed from a fresh load, with the same result);
    /// `MLASERVE_SHARED_EARLY=0` or `k_routed = x_div`: pairs in order, nothing early.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemv_swiglu(
        &self,
        pairs: usize,
        w_ptrs: u64,
        first: usize,
        held: usize,
        ids: u64,
        x: u64,
        x_div: usize,
        k_routed: usize,
        n: usize,
        f: usize,
        views: SliceViews,
        act: u64,
    ) -> Result<()> {
        let ex = (first, held, ids, x, x_div, k_routed);
        self.moe_gemv_swiglu_after(pairs, w_ptrs, ex, n, f, views, act, false)
    }

    /// [`Gpu::moe_gemv_swiglu`]; `nowait` (the caller vouches that the kernel before this one
    /// is `moe_norm_route_cl` letting it in after x's rows are written and fenced,
    /// [`Gpu::shared_nowait`]): the shared slices' blocks read x without waiting for that
    /// kernel to complete, so their 2 x f rows stream during the routing's latency-bound tail.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemv_swiglu_after(
        &self,
        pairs: usize,
        w_ptrs: u64,
        (first, held, ids, x, x_div, k_routed): (usize, usize, u64, u64, usize, usize),
        n: usize,
        f: usize,
        views: SliceViews,
        act: u64,
        nowait: bool,
    ) -> Result<()> {
        if !n.is_multiple_of(8) || x_div == 0 || k_routed > x_div {
            return Err(CudaError::Invalid(format!(
                "moe_gemv_swiglu needs n % 8 == 0, x_div > 0 and k_routed <= x_div, got n {n}, \
                 x_div {x_div}, k_routed {k_routed}"
            )));
        }
        static EARLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let early = *EARLY
            .get_or_init(|| std::env::var("MLASERVE_SHARED_EARLY").map_or(true, |v| v != "0"));
        let kr = if early && pairs.is_multiple_of(x_div) && views.has_slices() {
            k_routed
        } else {
            x_div
        };
        let (fi, hd, xd, n32, f32_) = (first as i32, held as i32, x_div as i32, n as i32, f as i32);
        let (er, fs) = views.args();
        let kr = kr as i32;
        // (routed blocks must remain: they wait, so the kernel after this one still starts
        // only once the routing has completed — which the combine's early reads of ids,
        // moe_gemv_combine_after, rely on too)
        let tab = moe_table() | (((nowait && 0 < kr && kr < xd) as i32) << 1);
        self.launch(
            "moe_gemv_swiglu",
            Gpu::cfg((f.div_ceil(8) as u32, pairs as u32, 1), 256),
            &args![w_ptrs, fi, hd, ids, x, xd, n32, f32_, er, fs, kr, act, tab],
        )
    }

    /// Whether the shared slices of the expert GEMV after [`Gpu::moe_norm_route`] may skip
    /// their wait ([`Gpu::moe_gemv_swiglu_after`]): the routing runs on the cluster kernel,
    /// which lets the next kernel in only after its logits (so after x's rows, which its
    /// block 0 fences at gpu scope first when called with `fence_hnb`, as the caller must be
    /// whenever this is true). The ordering is the hardware's, checked on sm_90 (H200) only,
    /// so other GPUs wait. `MLASERVE_SHARED_NOWAIT=0`: never, for comparisons. V2-Lite bf16
    /// b1: 1,868 → 1,837 µs a step (bench/cuda/v2lite.md, session 24).
    pub fn shared_nowait(&self, c: &RouteCfg, h: usize) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("MLASERVE_SHARED_NOWAIT").map_or(true, |v| v != "0"))
            && self.arch.starts_with("sm_90")
            && self.route_cluster(c, h).is_some()
            && route_late_bits() & 1 != 0
    }

    /// x[t, r] += sum_j w[t, j] * (W_{ids[t, j]}[r, :] . act[t*k + j, :]) for `t` tokens of
    /// `k` slots (t * k <= 256), W bf16 [rows, n]: [`Gpu::moe_gemv`] then
    /// [`Gpu::moe_combine_pairs`], bit for bit, in one kernel. Ids from `views.e_routed` on are
    /// shared-expert slices ([`SliceViews`]).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemv_combine(
        &self,
        t: usize,
        k: usize,
        w_ptrs: u64,
        first: usize,
        held: usize,
        ids: u64,
        act: u64,
        w: u64,
        n: usize,
        rows: usize,
        views: SliceViews,
        x: u64,
    ) -> Result<()> {
        let ex = (first, held, ids, act, w);
        self.moe_gemv_combine_after(t, k, w_ptrs, ex, n, rows, views, x, false)
    }

    /// [`Gpu::moe_gemv_combine`]; `ids_final` (the caller vouches that the kernel before this
    /// one is [`Gpu::moe_gemv_swiglu`] over the same `ids`, whose routed blocks wait for the
    /// kernel that wrote them before they let this one in): each warp loads its first weights
    /// before waiting for the SwiGLU kernel, beside its tail (kernels/moe.cu). The same sums.
    /// `MLASERVE_COMBINE_EARLY=0`: never, for comparisons. V2-Lite bf16 b1 on an H100: 2,278
    /// → 2,232 µs a step (bench/cuda/v2lite.md, session 41).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemv_combine_after(
        &self,
        t: usize,
        k: usize,
        w_ptrs: u64,
        (first, held, ids, act, w): (usize, usize, u64, u64, u64),
        n: usize,
        rows: usize,
        views: SliceViews,
        x: u64,
        ids_final: bool,
    ) -> Result<()> {
        if !n.is_multiple_of(8) || t * k > 256 {
            return Err(CudaError::Invalid(format!(
                "moe_gemv_combine needs n % 8 == 0 and <= 256 pairs, got n {n}, {t} tokens of \
                 {k} slots"
            )));
        }
        let (fi, hd, k32, n32, r32) = (first as i32, held as i32, k as i32, n as i32, rows as i32);
        let t32 = t as i32;
        let (er, fs) = views.args();
        // Rows a block: 4, or 8 under MLASERVE_COMBINE_ROWS=8 (for comparisons).
        static R8: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let r8 = *R8.get_or_init(|| std::env::var("MLASERVE_COMBINE_ROWS").is_ok_and(|v| v == "8"));
        let (name, rg) = if r8 {
            ("moe_gemv_combine_r8", 8)
        } else {
            ("moe_gemv_combine", 4)
        };
        self.launch(
            name,
            Gpu::cfg((rows.div_ceil(rg) as u32, 1, 1), 256),
            &args![
                w_ptrs,
                fi,
                hd,
                ids,
                act,
                w,
                t32,
                k32,
                n32,
                r32,
                er,
                fs,
                x,
                moe_table() | ((ids_final && combine_early()) as i32) << 1
            ],
        )
    }

    /// x[t, :] += sum_j w[t, j] * y[t*k + j, :].
    pub fn moe_combine_pairs(
        &self,
        t: usize,
        x: u64,
        y: u64,
        w: u64,
        k: usize,
        h: usize,
    ) -> Result<()> {
        let grid = (t as u32, h.div_ceil(256) as u32, 1);
        let (k, h) = (k as i32, h as i32);
        self.launch(
            "moe_combine_pairs",
            Gpu::cfg(grid, 256),
            &args![x, y, w, k, h],
        )
    }
}

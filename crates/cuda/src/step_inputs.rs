//! The host arrays of one step and their device copies: token ids, cache slots, RoPE tables,
//! block tables, the per-token key lists of the attention kernels (see attention.cu) and the
//! rows that want logits.
//!
//! Invariants: the host side ([`HostInputs`], [`KeyListHost`]) is computed from the
//! [`ForwardBatch`] alone. The device side is either uploaded into the step arena (eager steps)
//! or held in persistent buffers that a CUDA graph was captured with ([`StepInputs::new`] with
//! `persistent`) and rewritten in place before each replay ([`StepInputs::write`]): same
//! addresses, lengths no larger than at capture (checked; the block tables get a capacity).

use crate::error::{CudaError, Result};
use crate::flash_attn::{fa_tiles, FaVariant};
use crate::gpu::{DBuf, Gpu};
use mlaserve_model::ForwardBatch;

/// Per-query key lists of one step, host side: which keys each token attends to, on which
/// path, and the positions the unabsorbed path decompresses.
pub(crate) struct KeyListHost {
    /// [T] keys of unabsorbed-path tokens the CUDA-core kernel takes (DSA-selected ones, or
    /// all of them without the tensor-core kernel); 0 for every other token.
    n_mha: Vec<i32>,
    /// [T] keys of unabsorbed-path tokens with dense causal lists (0 for the rest), and their
    /// query tiles for the tensor-core kernel (pairs: first token, count; see flash_attn.rs).
    n_flash: Vec<i32>,
    flash_tiles: Vec<i32>,
    /// [T] keys of absorbed-path tokens (0 for unabsorbed ones).
    n_mqa: Vec<i32>,
    /// [T] offset into sel_pos, or -1 (dense causal).
    sel_off: Vec<i32>,
    sel_pos: Vec<i32>,
    /// [T] first row of the token's sequence in the decompressed K/V.
    kv_base: Vec<i32>,
    /// [S] cache slots of every position of the unabsorbed sequences, in order.
    mha_slots: Vec<i64>,
}

impl KeyListHost {
    /// `selected[t]`: DSA's positions for token t, or None (all positions <= its own).
    /// With `flash`, dense unabsorbed tokens go to the tensor-core kernel in its tiles.
    pub fn build(
        batch: &ForwardBatch,
        selected: &[Option<Vec<usize>>],
        flash: Option<FaVariant>,
    ) -> Self {
        let t = batch.num_tokens();
        let mut h = KeyListHost {
            n_mha: vec![0; t],
            n_flash: vec![0; t],
            flash_tiles: Vec::new(),
            n_mqa: vec![0; t],
            sel_off: vec![-1; t],
            sel_pos: Vec::new(),
            kv_base: vec![0; t],
            mha_slots: Vec::new(),
        };
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let bs = batch.block_size;
        for (s, seq) in batch.seqs.iter().enumerate() {
            let (a, b) = (batch.seq_starts[s], batch.seq_starts[s + 1]);
            let decode = batch.is_decode[a];
            let base = h.mha_slots.len() as i32;
            if !decode {
                for pos in 0..seq.context_len + (b - a) {
                    let slot = seq.block_table[pos / bs] as usize * bs + pos % bs;
                    h.mha_slots.push(slot as i64);
                }
            }
            for (ti, sel) in selected.iter().enumerate().take(b).skip(a) {
                let count = match sel {
                    Some(sel) => {
                        h.sel_off[ti] = h.sel_pos.len() as i32;
                        h.sel_pos.extend(sel.iter().map(|&j| j as i32));
                        sel.len()
                    }
                    None => batch.positions[ti] + 1,
                } as i32;
                if decode {
                    h.n_mqa[ti] = count;
                    continue;
                }
                h.kv_base[ti] = base;
                if flash.is_some() && selected[ti].is_none() {
                    h.n_flash[ti] = count;
                    // Runs of consecutive dense tokens of this sequence.
                    match runs.last_mut() {
                        Some(r) if r.1 == ti && ti > a => r.1 = ti + 1,
                        _ => runs.push((ti, ti + 1)),
                    }
                } else {
                    h.n_mha[ti] = count;
                }
            }
        }
        if h.sel_pos.is_empty() {
            h.sel_pos.push(0);
        }
        if let Some(f) = flash {
            h.flash_tiles = fa_tiles(&runs, &h.n_flash, f.bm());
        }
        h
    }

    /// The longest absorbed-path key list (0 without decode tokens).
    pub fn max_mqa(&self) -> usize {
        self.n_mqa.iter().copied().max().unwrap_or(0) as usize
    }
}

/// [`KeyListHost`] on the device, with the host facts the step branches on.
pub(crate) struct KeyListSet {
    pub n_mha: DBuf<i32>,
    pub any_mha: bool,
    pub n_flash: DBuf<i32>,
    pub flash_tiles: DBuf<i32>,
    pub n_flash_tiles: usize,
    pub n_mqa: DBuf<i32>,
    pub sel_off: DBuf<i32>,
    pub sel_pos: DBuf<i32>,
    pub kv_base: DBuf<i32>,
    pub mha_slots: DBuf<i64>,
    pub max_mqa: usize,
    /// Host copies for compacting the absorbed path to its tokens.
    pub n_mqa_h: Vec<i32>,
    pub sel_off_h: Vec<i32>,
}

/// A device buffer holding `data`: uploaded (arena while a step is open), or persistent
/// (outside the arena) of at least `cap` elements.
fn put<T: Copy>(gpu: &Gpu, data: &[T], persistent: Option<usize>) -> Result<DBuf<T>> {
    match persistent {
        None => gpu.upload(data),
        Some(cap) => {
            let d = gpu.alloc_persistent::<T>(data.len().max(cap))?;
            gpu.write(&d, 0, data)?;
            Ok(d)
        }
    }
}

/// Rewrites a persistent buffer in place; `what` names it if `data` outgrew it.
fn rewrite<T: Copy>(gpu: &Gpu, d: &DBuf<T>, data: &[T], what: &str) -> Result<()> {
    if data.len() > d.len() {
        return Err(CudaError::Invalid(format!(
            "graph input {what}: {} elements, captured with room for {}",
            data.len(),
            d.len()
        )));
    }
    gpu.write(d, 0, data)
}

impl KeyListSet {
    pub fn new(gpu: &Gpu, h: &KeyListHost, persistent: bool) -> Result<Self> {
        let p = persistent.then_some(0);
        Ok(Self {
            n_mha: put(gpu, &h.n_mha, p)?,
            any_mha: h.n_mha.iter().any(|&k| k > 0),
            n_flash: put(gpu, &h.n_flash, p)?,
            flash_tiles: put(
                gpu,
                if h.flash_tiles.is_empty() {
                    &[0, 0]
                } else {
                    &h.flash_tiles
                },
                p,
            )?,
            n_flash_tiles: h.flash_tiles.len() / 2,
            n_mqa: put(gpu, &h.n_mqa, p)?,
            sel_off: put(gpu, &h.sel_off, p)?,
            sel_pos: put(gpu, &h.sel_pos, p)?,
            kv_base: put(gpu, &h.kv_base, p)?,
            mha_slots: put(gpu, &h.mha_slots, p)?,
            max_mqa: h.max_mqa(),
            n_mqa_h: h.n_mqa.clone(),
            sel_off_h: h.sel_off.clone(),
        })
    }

    /// Built and uploaded for this step.
    pub fn build(
        gpu: &Gpu,
        batch: &ForwardBatch,
        selected: &[Option<Vec<usize>>],
        flash: Option<FaVariant>,
    ) -> Result<Self> {
        Self::new(gpu, &KeyListHost::build(batch, selected, flash), false)
    }

    /// Rewrites persistent lists in place (a graph replay: the same branches must hold).
    fn write(&mut self, gpu: &Gpu, h: &KeyListHost) -> Result<()> {
        if h.n_mha.iter().any(|&k| k > 0) != self.any_mha
            || h.flash_tiles.len() / 2 != self.n_flash_tiles
        {
            return Err(CudaError::Invalid(
                "graph replay with other attention paths than at capture".into(),
            ));
        }
        rewrite(gpu, &self.n_mha, &h.n_mha, "n_mha")?;
        rewrite(gpu, &self.n_flash, &h.n_flash, "n_flash")?;
        if !h.flash_tiles.is_empty() {
            rewrite(gpu, &self.flash_tiles, &h.flash_tiles, "flash tiles")?;
        }
        rewrite(gpu, &self.n_mqa, &h.n_mqa, "n_mqa")?;
        rewrite(gpu, &self.sel_off, &h.sel_off, "sel_off")?;
        rewrite(gpu, &self.sel_pos, &h.sel_pos, "sel_pos")?;
        rewrite(gpu, &self.kv_base, &h.kv_base, "kv_base")?;
        rewrite(gpu, &self.mha_slots, &h.mha_slots, "mha_slots")?;
        self.max_mqa = h.max_mqa();
        self.n_mqa_h.clone_from(&h.n_mqa);
        self.sel_off_h.clone_from(&h.sel_off);
        Ok(())
    }
}

/// The host arrays of a step.
pub(crate) struct HostInputs {
    pub dense: KeyListHost,
    pub tokens: Vec<u32>,
    pub slots: Vec<i64>,
    /// [T, R/2] RoPE tables at each token's position.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// Every sequence's block table, concatenated; bt_off [T] is each token's offset.
    pub block_tables: Vec<i32>,
    pub bt_off: Vec<i32>,
    /// Rows of the step's hidden states that want logits.
    pub logit_rows: Vec<i32>,
}

/// A step's inputs on the device.
pub(crate) struct StepInputs {
    /// Key lists of layers without a DSA selection (all of them for DeepSeek).
    pub dense: KeyListSet,
    pub tokens: DBuf<u32>,
    pub slots: DBuf<i64>,
    pub cos: DBuf<f32>,
    pub sin: DBuf<f32>,
    pub block_tables: DBuf<i32>,
    pub bt_off: DBuf<i32>,
    pub bt_off_h: Vec<i32>,
    pub logit_rows: DBuf<i32>,
    pub n_logits: usize,
}

impl StepInputs {
    /// Uploaded for one step, or (`persistent = Some(block table capacity)`) in buffers that
    /// outlive it, for a CUDA graph.
    pub fn new(gpu: &Gpu, h: &HostInputs, persistent: Option<usize>) -> Result<Self> {
        let p = persistent.map(|_| 0);
        Ok(Self {
            dense: KeyListSet::new(gpu, &h.dense, persistent.is_some())?,
            tokens: put(gpu, &h.tokens, p)?,
            slots: put(gpu, &h.slots, p)?,
            cos: put(gpu, &h.cos, p)?,
            sin: put(gpu, &h.sin, p)?,
            block_tables: put(gpu, &h.block_tables, persistent)?,
            bt_off: put(gpu, &h.bt_off, p)?,
            bt_off_h: h.bt_off.clone(),
            logit_rows: put(gpu, &h.logit_rows, p)?,
            n_logits: h.logit_rows.len(),
        })
    }

    /// Whether `h` fits the buffers (the block tables are the only input whose length varies
    /// between steps of one graph shape).
    pub fn fits(&self, h: &HostInputs) -> bool {
        h.block_tables.len() <= self.block_tables.len()
    }

    /// Rewrites persistent inputs in place for a graph replay of the same shape.
    pub fn write(&mut self, gpu: &Gpu, h: &HostInputs) -> Result<()> {
        if h.tokens.len() != self.tokens.len() || h.logit_rows.len() != self.n_logits {
            return Err(CudaError::Invalid(format!(
                "graph replay of {} tokens ({} logits) captured for {} ({})",
                h.tokens.len(),
                h.logit_rows.len(),
                self.tokens.len(),
                self.n_logits
            )));
        }
        self.dense.write(gpu, &h.dense)?;
        rewrite(gpu, &self.tokens, &h.tokens, "tokens")?;
        rewrite(gpu, &self.slots, &h.slots, "slots")?;
        rewrite(gpu, &self.cos, &h.cos, "cos")?;
        rewrite(gpu, &self.sin, &h.sin, "sin")?;
        rewrite(gpu, &self.block_tables, &h.block_tables, "block tables")?;
        rewrite(gpu, &self.bt_off, &h.bt_off, "bt_off")?;
        rewrite(gpu, &self.logit_rows, &h.logit_rows, "logit rows")?;
        self.bt_off_h.clone_from(&h.bt_off);
        Ok(())
    }
}

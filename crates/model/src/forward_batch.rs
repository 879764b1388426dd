//! `ForwardBatch`: the model's input contract for one engine step.
//!
//! A batch holds one or more sequences. Each contributes `tokens` (the new tokens this step,
//! at least one) whose positions continue its `context_len` tokens already in the latent
//! cache. Invariants (checked by [`ForwardBatch::new`]):
//! - `block_table` covers `context_len + tokens.len()` positions: position `p` lives in slot
//!   `block_table[p / block_size] * block_size + p % block_size`;
//! - flattened order is sequence order; `positions`, `slot_mapping` and `is_decode` are
//!   indexed by flattened token;
//! - a token takes the decode (absorbed, "MQA") path when its sequence has a query length
//!   of 1 under `AttentionPath::Auto`, or always/never when the path is forced.

use crate::error::ModelError;

/// Which MLA formulation attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// Query length 1 takes the absorbed path, longer queries the unabsorbed one.
    #[default]
    Auto,
    /// Force the unabsorbed path (K/V decompressed through kv_b) for every token.
    Mha,
    /// Force the absorbed path (attend over 576-wide latent rows) for every token.
    Mqa,
}

impl std::str::FromStr for AttentionPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "mha" => Ok(Self::Mha),
            "mqa" => Ok(Self::Mqa),
            other => Err(format!(
                "unknown attention path `{other}` (expected auto, mha or mqa)"
            )),
        }
    }
}

/// Which logits a sequence wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that does not reach the end of the prompt).
    None,
    /// Only the last token's.
    Last,
    /// Every token's (scoring, `mlaserve logits`).
    All,
}

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct SeqInput {
    /// New tokens this step (query length >= 1).
    pub tokens: Vec<u32>,
    /// Tokens of this sequence already in the cache: positions `0..context_len`.
    pub context_len: usize,
    /// Cache blocks of the sequence, in position order.
    pub block_table: Vec<u32>,
    /// Which logits to return.
    pub logits: LogitsWanted,
}

/// The flattened batch the layers consume.
#[derive(Debug, Clone)]
pub struct ForwardBatch {
    pub seqs: Vec<SeqInput>,
    pub block_size: usize,
    pub path: AttentionPath,
    /// [T] token ids, sequence after sequence.
    pub tokens: Vec<u32>,
    /// [T] absolute position of each token.
    pub positions: Vec<usize>,
    /// [T] cache slot each token's latent row is written to.
    pub slot_mapping: Vec<usize>,
    /// [T] whether the token attends through the absorbed (decode) path.
    pub is_decode: Vec<bool>,
    /// [num_seqs + 1] start of each sequence in the flattened tokens.
    pub seq_starts: Vec<usize>,
}

impl ForwardBatch {
    /// Flatten `seqs`, computing positions, slots and paths; checks every invariant.
    pub fn new(
        seqs: Vec<SeqInput>,
        block_size: usize,
        path: AttentionPath,
    ) -> Result<Self, ModelError> {
        if block_size == 0 {
            return Err(ModelError::Batch("block_size must be > 0".into()));
        }
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut slot_mapping = Vec::new();
        let mut is_decode = Vec::new();
        let mut seq_starts = vec![0];
        for (i, s) in seqs.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(ModelError::Batch(format!("sequence {i} has no new tokens")));
            }
            let end = s.context_len + s.tokens.len();
            let needed = end.div_ceil(block_size);
            if s.block_table.len() < needed {
                return Err(ModelError::Batch(format!(
                    "sequence {i}: block table has {} blocks, {end} positions need {needed}",
                    s.block_table.len()
                )));
            }
            let decode = match path {
                AttentionPath::Auto => s.tokens.len() == 1,
                AttentionPath::Mha => false,
                AttentionPath::Mqa => true,
            };
            for (j, &t) in s.tokens.iter().enumerate() {
                let p = s.context_len + j;
                tokens.push(t);
                positions.push(p);
                slot_mapping
                    .push(s.block_table[p / block_size] as usize * block_size + p % block_size);
                is_decode.push(decode);
            }
            seq_starts.push(tokens.len());
        }
        Ok(Self {
            seqs,
            block_size,
            path,
            tokens,
            positions,
            slot_mapping,
            is_decode,
            seq_starts,
        })
    }

    /// Total new tokens T.
    /// Checks the batch against a cache of `num_blocks` blocks of `block_size` slots and a
    /// vocabulary of `vocab` ids, before any executor touches memory: every slot and block in
    /// range, every token id < vocab. (`new` already checked that each block table covers its
    /// sequence.) Shared by every executor, so a bad batch is the same error on every device.
    pub fn check_against(
        &self,
        num_blocks: usize,
        block_size: usize,
        vocab: usize,
    ) -> Result<(), ModelError> {
        if block_size != self.block_size {
            return Err(ModelError::Batch(format!(
                "batch block size {} != cache block size {block_size}",
                self.block_size
            )));
        }
        let num_slots = num_blocks * block_size;
        if let Some(&s) = self.slot_mapping.iter().max() {
            if s >= num_slots {
                return Err(ModelError::Batch(format!(
                    "slot {s} past the cache's {num_slots} slots"
                )));
            }
        }
        for seq in &self.seqs {
            let end = seq.context_len + seq.tokens.len();
            if let Some(&b) = seq.block_table[..end.div_ceil(self.block_size)]
                .iter()
                .max()
            {
                if b as usize >= num_blocks {
                    return Err(ModelError::Batch(format!(
                        "block {b} past the cache's {num_blocks} blocks"
                    )));
                }
            }
        }
        if let Some(&tok) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Batch(format!(
                "token id {tok} >= vocab size {vocab}"
            )));
        }
        Ok(())
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Flattened indices of the tokens whose logits are returned, in order.
    pub fn logits_indices(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, s) in self.seqs.iter().enumerate() {
            let (a, b) = (self.seq_starts[i], self.seq_starts[i + 1]);
            match s.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => out.push(b - 1),
                LogitsWanted::All => out.extend(a..b),
            }
        }
        out
    }
}

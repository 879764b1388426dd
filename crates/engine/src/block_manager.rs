//! Paged latent-cache block accounting with prefix caching (after vLLM v1's `BlockPool` /
//! `KVCacheManager` and nano-vllm's `BlockManager`). Pure bookkeeping: no device memory.
//!
//! The cache holds `num_blocks` blocks of `block_size` token positions. A sequence's
//! [`BlockTable`] lists its blocks in position order; position `p` lives in block
//! `table[p / block_size]`.
//!
//! Invariants (checked by [`BlockManager::check_integrity`]):
//! - every block is in exactly one state: **free** (on the free list, no hash, refcount 0),
//!   **referenced** (refcount = number of tables holding it, > 0), or **cached-unreferenced**
//!   (refcount 0, registered in the hash map, in the LRU evictable set);
//! - the hash map and the blocks agree: `map[h] = b` iff block `b` carries hash `h`;
//! - only FULL blocks whose latent rows have been computed are registered.
//!
//! Prefix caching: a full block is identified by the chained hash `H(parent hash, its
//! block_size token ids)`, so equal hashes mean equal whole prefixes. A registered block also
//! keeps its parent hash and token ids, and a lookup compares them, so a 64-bit hash
//! collision cannot return wrong rows unless the parent hashes also collide. Unreferenced
//! cached blocks are evicted least-recently-freed first; a sequence frees its blocks tail
//! first, so a prefix's later blocks go before its earlier ones.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};

/// Index of a cache block.
pub type BlockId = u32;
/// Chained hash of a full block's tokens and its whole prefix.
pub type BlockHash = u64;

/// The allocator could not satisfy a request; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("out of cache blocks: need {needed}, {available} available")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub available: usize,
}

/// What a registered block holds, kept to verify hash hits.
#[derive(Debug, Clone)]
struct CachedContent {
    hash: BlockHash,
    parent: Option<BlockHash>,
    token_ids: Box<[u32]>,
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// Set while the block is registered in the prefix cache.
    cached: Option<CachedContent>,
    /// LRU key while the block is cached and unreferenced.
    evict_tick: Option<u64>,
}

/// A sequence's blocks; only the [`BlockManager`] edits it.
#[derive(Debug, Clone, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// Chained hashes of the leading full, computed blocks (`hashes.len() <= blocks.len()`).
    hashes: Vec<BlockHash>,
}

impl BlockTable {
    /// Block ids in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// Result of a prefix-cache lookup: full blocks holding a prompt's leading tokens.
#[derive(Debug, Clone, Default)]
pub struct CachedPrefix {
    blocks: Vec<BlockId>,
    hashes: Vec<BlockHash>,
    /// Tokens the lookup was asked about (0 when prefix caching is off).
    num_query_tokens: usize,
}

impl CachedPrefix {
    /// No cached prefix, not counted as a lookup.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Tokens whose rows are already in the cache.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

/// Prefix-cache hit counters, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

/// Chained block hash: `H(parent, token_ids)`.
pub fn block_hash(parent: Option<BlockHash>, token_ids: &[u32]) -> BlockHash {
    let mut h = DefaultHasher::new();
    match parent {
        Some(p) => {
            h.write_u8(1);
            h.write_u64(p);
        }
        None => h.write_u8(0),
    }
    for &t in token_ids {
        h.write_u32(t);
    }
    h.finish()
}

/// Free list, refcounts and the prefix-cache map over a fixed pool of blocks.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    /// Blocks with no content worth keeping; allocated before any eviction.
    free: Vec<BlockId>,
    /// Cached, unreferenced blocks by LRU tick (smallest = evicted first).
    evictable: BTreeMap<u64, BlockId>,
    hash_to_block: HashMap<BlockHash, BlockId>,
    enable_prefix_caching: bool,
    tick: u64,
    stats: PrefixCacheStats,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` positions. Both must be > 0 and
    /// `num_blocks` must fit a `u32` (the engine validates its config before this).
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        assert!(
            num_blocks > 0 && block_size > 0,
            "BlockManager needs num_blocks > 0 and block_size > 0"
        );
        assert!(
            num_blocks <= u32::MAX as usize,
            "num_blocks {num_blocks} does not fit a u32 block id"
        );
        Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that pop() hands out block 0 first.
            free: (0..num_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            hash_to_block: HashMap::new(),
            enable_prefix_caching,
            tick: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks an allocation can take now: free ones plus evictable cached ones.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.blocks.len() - self.num_free_blocks()
    }

    /// Cached blocks (referenced or not) available for prefix hits.
    pub fn num_cached_blocks(&self) -> usize {
        self.hash_to_block.len()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Full cached blocks covering a leading part of `token_ids`. At most
    /// `(len - 1) / block_size` blocks are returned, so at least the last token is always
    /// recomputed (its logits are needed) and no write ever lands in a shared block.
    pub fn find_cached_prefix(&self, token_ids: &[u32]) -> CachedPrefix {
        if !self.enable_prefix_caching || token_ids.is_empty() {
            return CachedPrefix::none();
        }
        let max_blocks = (token_ids.len() - 1) / self.block_size;
        let mut prefix = CachedPrefix {
            num_query_tokens: token_ids.len(),
            ..CachedPrefix::none()
        };
        let mut parent = None;
        for chunk in token_ids.chunks_exact(self.block_size).take(max_blocks) {
            let h = block_hash(parent, chunk);
            let Some(&b) = self.hash_to_block.get(&h) else {
                break;
            };
            let content = self.blocks[b as usize].cached.as_ref();
            match content {
                Some(c) if c.parent == parent && *c.token_ids == *chunk => {}
                _ => break, // hash collision: treat as a miss
            }
            prefix.blocks.push(b);
            prefix.hashes.push(h);
            parent = Some(h);
        }
        prefix
    }

    /// New blocks needed for `table` (+ `prefix`) to hold `num_tokens` positions.
    fn num_new_blocks(
        &self,
        table: &BlockTable,
        prefix: &CachedPrefix,
        num_tokens: usize,
    ) -> usize {
        num_tokens
            .div_ceil(self.block_size)
            .saturating_sub(table.len() + prefix.num_blocks())
    }

    /// Blocks available to this allocation: touching a cached-unreferenced prefix block takes
    /// it out of the evictable set, so those do not count.
    fn num_available_for(&self, prefix: &CachedPrefix) -> usize {
        let touched = prefix
            .blocks
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count();
        self.num_free_blocks() - touched
    }

    /// Whether [`allocate`](Self::allocate) of the same arguments would succeed.
    pub fn can_allocate(
        &self,
        table: &BlockTable,
        prefix: &CachedPrefix,
        num_tokens: usize,
    ) -> bool {
        self.num_new_blocks(table, prefix, num_tokens) <= self.num_available_for(prefix)
    }

    /// Takes `prefix`'s cached blocks (a sequence's first admission: `table` must be empty
    /// when `prefix` is not) and grows `table` to hold `num_tokens` positions. Counts the
    /// lookup in the prefix-cache stats. On error nothing changes.
    pub fn allocate(
        &mut self,
        table: &mut BlockTable,
        prefix: CachedPrefix,
        num_tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        assert!(
            prefix.blocks.is_empty() || table.is_empty(),
            "a cached prefix can only start an empty block table"
        );
        let needed = self.num_new_blocks(table, &prefix, num_tokens);
        let available = self.num_available_for(&prefix);
        if needed > available {
            return Err(OutOfBlocks { needed, available });
        }
        self.stats.queries += prefix.num_query_tokens as u64;
        self.stats.hits += prefix.num_tokens(self.block_size) as u64;
        for (&b, &h) in prefix.blocks.iter().zip(&prefix.hashes) {
            let block = &mut self.blocks[b as usize];
            if let Some(tick) = block.evict_tick.take() {
                self.evictable.remove(&tick);
            }
            block.ref_count += 1;
            table.blocks.push(b);
            table.hashes.push(h);
        }
        for _ in 0..needed {
            let b = self.take_block();
            table.blocks.push(b);
        }
        Ok(())
    }

    /// Whether `table` can grow to hold `num_tokens` positions (decode growth, prefill chunks).
    pub fn can_append(&self, table: &BlockTable, num_tokens: usize) -> bool {
        self.can_allocate(table, &CachedPrefix::none(), num_tokens)
    }

    /// Grows `table` to hold `num_tokens` positions; on error nothing changes.
    pub fn append_slot(
        &mut self,
        table: &mut BlockTable,
        num_tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        self.allocate(table, CachedPrefix::none(), num_tokens)
    }

    /// A block with refcount 1: a free one, else the least recently freed cached one
    /// (dropping its registration). Callers check availability first.
    fn take_block(&mut self) -> BlockId {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self
                    .evictable
                    .pop_first()
                    .expect("take_block: availability was checked");
                let block = &mut self.blocks[b as usize];
                block.evict_tick = None;
                if let Some(c) = block.cached.take() {
                    self.hash_to_block.remove(&c.hash);
                }
                b
            }
        };
        let block = &mut self.blocks[b as usize];
        debug_assert_eq!(block.ref_count, 0);
        block.ref_count = 1;
        b
    }

    /// Registers the full blocks among the first `num_computed_tokens` positions of
    /// `token_ids` (the sequence's tokens, whose rows are now written). A block whose content
    /// is already cached elsewhere stays unregistered (it is freed normally later).
    pub fn cache_full_blocks(
        &mut self,
        table: &mut BlockTable,
        token_ids: &[u32],
        num_computed_tokens: usize,
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let num_full =
            (num_computed_tokens.min(token_ids.len()) / self.block_size).min(table.blocks.len());
        for i in table.hashes.len()..num_full {
            let parent = table.hashes.last().copied();
            let chunk = &token_ids[i * self.block_size..(i + 1) * self.block_size];
            let h = block_hash(parent, chunk);
            table.hashes.push(h);
            let b = table.blocks[i];
            if self.hash_to_block.contains_key(&h) || self.blocks[b as usize].cached.is_some() {
                continue;
            }
            self.blocks[b as usize].cached = Some(CachedContent {
                hash: h,
                parent,
                token_ids: chunk.into(),
            });
            self.hash_to_block.insert(h, b);
        }
    }

    /// Releases every block of `table` (tail first) and empties it.
    pub fn free(&mut self, table: &mut BlockTable) {
        for &b in table.blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            assert!(
                block.ref_count > 0,
                "block {b} freed more often than referenced"
            );
            block.ref_count -= 1;
            if block.ref_count == 0 {
                if block.cached.is_some() {
                    block.evict_tick = Some(self.tick);
                    self.evictable.insert(self.tick, b);
                    self.tick += 1;
                } else {
                    self.free.push(b);
                }
            }
        }
        table.blocks.clear();
        table.hashes.clear();
    }

    /// Checks every invariant of the module doc against the live `tables`; the error names
    /// the first violation.
    pub fn check_integrity<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a BlockTable>,
    ) -> Result<(), String> {
        let n = self.blocks.len();
        let mut refs = vec![0u32; n];
        for (t, table) in tables.into_iter().enumerate() {
            if table.hashes.len() > table.blocks.len() {
                return Err(format!(
                    "table {t}: {} hashes for {} blocks",
                    table.hashes.len(),
                    table.blocks.len()
                ));
            }
            for &b in &table.blocks {
                let slot = refs
                    .get_mut(b as usize)
                    .ok_or_else(|| format!("table {t}: block id {b} out of range {n}"))?;
                *slot += 1;
            }
        }
        let mut state = vec![0u8; n]; // bit 0: free list, bit 1: evictable
        for &b in &self.free {
            if state[b as usize] & 1 != 0 {
                return Err(format!("block {b} twice on the free list"));
            }
            state[b as usize] |= 1;
        }
        for (&tick, &b) in &self.evictable {
            if state[b as usize] != 0 {
                return Err(format!(
                    "block {b} both free and evictable (or twice evictable)"
                ));
            }
            state[b as usize] |= 2;
            if self.blocks[b as usize].evict_tick != Some(tick) {
                return Err(format!(
                    "block {b} evictable at tick {tick} but records {:?}",
                    self.blocks[b as usize].evict_tick
                ));
            }
        }
        for (b, block) in self.blocks.iter().enumerate() {
            if block.ref_count != refs[b] {
                return Err(format!(
                    "block {b}: refcount {} but {} tables hold it",
                    block.ref_count, refs[b]
                ));
            }
            let ok = match (block.ref_count > 0, state[b]) {
                (true, 0) => block.evict_tick.is_none(),
                (false, 1) => block.cached.is_none() && block.evict_tick.is_none(),
                (false, 2) => block.cached.is_some(),
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "block {b} in no single state: refcount {}, free {}, evictable {}, cached {}",
                    block.ref_count,
                    state[b] & 1 != 0,
                    state[b] & 2 != 0,
                    block.cached.is_some()
                ));
            }
            if let Some(c) = &block.cached {
                if self.hash_to_block.get(&c.hash) != Some(&(b as BlockId)) {
                    return Err(format!(
                        "block {b} carries hash {:#x} that does not map back to it",
                        c.hash
                    ));
                }
                if c.token_ids.len() != self.block_size {
                    return Err(format!(
                        "block {b} cached with {} tokens, not a full block",
                        c.token_ids.len()
                    ));
                }
            }
        }
        for (&h, &b) in &self.hash_to_block {
            match self
                .blocks
                .get(b as usize)
                .and_then(|blk| blk.cached.as_ref())
            {
                Some(c) if c.hash == h => {}
                _ => {
                    return Err(format!(
                        "hash {h:#x} maps to block {b}, which does not carry it"
                    ))
                }
            }
        }
        Ok(())
    }
}

//! Block manager tests: focused cases (allocation, prefix hits, the last-token rule, LRU
//! eviction, duplicates, integrity checking), then property tests under random allocate /
//! grow / cache / free sequences on a small pool: integrity after every operation, `can_*`
//! agrees with the operation, a block shared by two tables holds the same prefix in both,
//! and freeing everything returns every block.

use mlaserve_engine::block_manager::{
    BlockManager, BlockTable, CachedPrefix, OutOfBlocks, PrefixCacheStats,
};
use proptest::prelude::*;

fn toks(n: usize, base: u32) -> Vec<u32> {
    (0..n as u32).map(|i| base + i).collect()
}

#[test]
fn allocate_grow_free_roundtrip() {
    let mut bm = BlockManager::new(4, 4, false);
    let mut t = BlockTable::default();
    assert!(bm.can_allocate(&t, &CachedPrefix::none(), 9));
    bm.allocate(&mut t, CachedPrefix::none(), 9).unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(bm.num_free_blocks(), 1);
    assert!(bm.can_append(&t, 16));
    assert!(!bm.can_append(&t, 17));
    assert_eq!(
        bm.append_slot(&mut t, 17),
        Err(OutOfBlocks {
            needed: 2,
            available: 1
        })
    );
    assert_eq!(t.len(), 3, "a failed allocation changes nothing");
    bm.append_slot(&mut t, 12).unwrap();
    assert_eq!(t.len(), 3, "12 positions fit in the 3 blocks held");
    bm.check_integrity([&t]).unwrap();
    bm.free(&mut t);
    assert!(t.is_empty());
    assert_eq!(bm.num_free_blocks(), 4);
    bm.check_integrity([&t]).unwrap();
}

#[test]
fn prefix_hit_shares_blocks_and_counts_tokens() {
    let mut bm = BlockManager::new(8, 4, true);
    let prompt = toks(10, 100);
    let mut a = BlockTable::default();
    let p = bm.find_cached_prefix(&prompt);
    assert_eq!(p.num_blocks(), 0);
    bm.allocate(&mut a, p, 10).unwrap();
    bm.cache_full_blocks(&mut a, &prompt, 10);
    assert_eq!(bm.num_cached_blocks(), 2);

    // Same first 8 tokens, different tail.
    let mut other = prompt[..8].to_vec();
    other.extend([7, 7, 7]);
    let p = bm.find_cached_prefix(&other);
    assert_eq!(p.num_tokens(4), 8);
    let mut b = BlockTable::default();
    bm.allocate(&mut b, p, 11).unwrap();
    assert_eq!(&b.blocks()[..2], &a.blocks()[..2]);
    assert_ne!(b.blocks()[2], a.blocks()[2]);
    assert_eq!(
        bm.prefix_cache_stats(),
        PrefixCacheStats {
            queries: 21,
            hits: 8
        }
    );
    bm.check_integrity([&a, &b]).unwrap();

    // Freeing both leaves the two cached blocks evictable, the rest free.
    bm.free(&mut a);
    bm.free(&mut b);
    bm.check_integrity([]).unwrap();
    assert_eq!(bm.num_free_blocks(), 8);
    assert_eq!(bm.num_cached_blocks(), 2);
    // A hit on an unreferenced cached block takes it out of the evictable set.
    let p = bm.find_cached_prefix(&prompt);
    assert_eq!(p.num_blocks(), 2);
    let mut c = BlockTable::default();
    bm.allocate(&mut c, p, 10).unwrap();
    assert_eq!(bm.num_free_blocks(), 5);
    bm.check_integrity([&c]).unwrap();
}

#[test]
fn lookup_always_leaves_the_last_token_to_compute() {
    let mut bm = BlockManager::new(8, 4, true);
    let prompt = toks(8, 0);
    let mut a = BlockTable::default();
    bm.allocate(&mut a, CachedPrefix::none(), 8).unwrap();
    bm.cache_full_blocks(&mut a, &prompt, 8);
    // An identical 8-token prompt may reuse only the first block: token 7 must be computed.
    assert_eq!(bm.find_cached_prefix(&prompt).num_tokens(4), 4);
    assert_eq!(bm.find_cached_prefix(&prompt[..4]).num_tokens(4), 0);
    assert_eq!(bm.find_cached_prefix(&toks(9, 0)).num_tokens(4), 8);
}

#[test]
fn eviction_is_lru_and_unregisters() {
    let mut bm = BlockManager::new(3, 2, true);
    let (x, y) = (vec![1, 2, 9], vec![3, 4, 9]);
    for seq in [&x, &y] {
        let mut t = BlockTable::default();
        bm.allocate(&mut t, CachedPrefix::none(), 3).unwrap();
        bm.cache_full_blocks(&mut t, seq, 3);
        bm.free(&mut t);
    }
    assert_eq!(bm.num_cached_blocks(), 2);
    // Needs all 3 blocks: takes the free one, then evicts x's block (freed first).
    let mut t = BlockTable::default();
    bm.allocate(&mut t, CachedPrefix::none(), 4).unwrap();
    assert_eq!(bm.find_cached_prefix(&x).num_blocks(), 0);
    assert_eq!(bm.find_cached_prefix(&y).num_blocks(), 1);
    bm.check_integrity([&t]).unwrap();
}

#[test]
fn duplicate_content_is_not_registered_twice() {
    let mut bm = BlockManager::new(4, 2, true);
    let s = vec![5, 6, 7];
    let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
    for t in [&mut a, &mut b] {
        bm.allocate(t, CachedPrefix::none(), 3).unwrap();
        bm.cache_full_blocks(t, &s, 3);
    }
    assert_eq!(bm.num_cached_blocks(), 1);
    bm.check_integrity([&a, &b]).unwrap();
    bm.free(&mut b);
    bm.free(&mut a);
    bm.check_integrity([]).unwrap();
}

#[test]
fn integrity_catches_a_refcount_mismatch() {
    let mut bm = BlockManager::new(4, 2, false);
    let mut t = BlockTable::default();
    bm.allocate(&mut t, CachedPrefix::none(), 2).unwrap();
    let err = bm.check_integrity([]).unwrap_err();
    assert!(err.contains("refcount"), "{err}");
}

#[derive(Debug, Clone)]
enum Op {
    /// Start a table for a prompt built from `pattern` (few distinct patterns → prefix hits).
    Admit { pattern: u8, len: usize },
    /// Grow table `i` by `n` tokens (decode / chunk), computing them.
    Grow { i: usize, n: usize },
    /// Free table `i`.
    Free { i: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, 1usize..20).prop_map(|(pattern, len)| Op::Admit { pattern, len }),
        (0usize..8, 1usize..6).prop_map(|(i, n)| Op::Grow { i, n }),
        (0usize..8).prop_map(|i| Op::Free { i }),
    ]
}

/// Tokens of a prompt: a shared pattern (so prompts share prefixes) plus a tail.
fn prompt(pattern: u8, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            if i < 8 {
                pattern as u32 * 100 + i
            } else {
                1000 + i * 7
            }
        })
        .collect()
}

struct Live {
    table: BlockTable,
    tokens: Vec<u32>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn block_manager_invariants_hold(
        num_blocks in 2usize..12,
        block_size in 1usize..5,
        caching in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut bm = BlockManager::new(num_blocks, block_size, caching);
        let mut live: Vec<Live> = Vec::new();
        let mut next_token = 5000u32;
        for op in ops {
            match op {
                Op::Admit { pattern, len } => {
                    let tokens = prompt(pattern, len);
                    let prefix = bm.find_cached_prefix(&tokens);
                    let cached = prefix.num_tokens(block_size);
                    prop_assert!(cached < tokens.len(), "the last token is always computed");
                    if !caching {
                        prop_assert_eq!(cached, 0);
                    }
                    let mut table = BlockTable::default();
                    let can = bm.can_allocate(&table, &prefix, tokens.len());
                    let res = bm.allocate(&mut table, prefix, tokens.len());
                    prop_assert_eq!(can, res.is_ok());
                    if res.is_ok() {
                        prop_assert_eq!(table.len(), tokens.len().div_ceil(block_size));
                        bm.cache_full_blocks(&mut table, &tokens, tokens.len());
                        live.push(Live { table, tokens });
                    } else {
                        prop_assert!(table.is_empty(), "failed allocation left blocks behind");
                    }
                }
                Op::Grow { i, n } => {
                    if live.is_empty() { continue; }
                    let k = i % live.len();
                    let l = &mut live[k];
                    let target = l.tokens.len() + n;
                    let before = l.table.len();
                    let can = bm.can_append(&l.table, target);
                    let res = bm.append_slot(&mut l.table, target);
                    prop_assert_eq!(can, res.is_ok());
                    if res.is_ok() {
                        for _ in 0..n { l.tokens.push(next_token); next_token += 1; }
                        bm.cache_full_blocks(&mut l.table, &l.tokens, l.tokens.len());
                    } else {
                        prop_assert_eq!(l.table.len(), before);
                    }
                }
                Op::Free { i } => {
                    if live.is_empty() { continue; }
                    let mut l = live.swap_remove(i % live.len());
                    bm.free(&mut l.table);
                    prop_assert!(l.table.is_empty());
                }
            }
            bm.check_integrity(live.iter().map(|l| &l.table)).map_err(TestCaseError::fail)?;
            prop_assert!(bm.num_free_blocks() + bm.num_used_blocks() == num_blocks);
            // A block shared by two tables must be a registered full block of equal content.
            for (a, la) in live.iter().enumerate() {
                for lb in &live[a + 1..] {
                    for (pa, ba) in la.table.blocks().iter().enumerate() {
                        if let Some(pb) = lb.table.blocks().iter().position(|b| b == ba) {
                            prop_assert_eq!(pa, pb, "shared block at different positions");
                            let r = pa * block_size..(pa + 1) * block_size;
                            prop_assert_eq!(&la.tokens[..r.end], &lb.tokens[..r.end], "shared block, different prefixes");
                        }
                    }
                }
            }
        }
        for mut l in live.drain(..) {
            bm.free(&mut l.table);
        }
        bm.check_integrity([]).map_err(TestCaseError::fail)?;
        prop_assert_eq!(bm.num_used_blocks(), 0);
        prop_assert_eq!(bm.num_free_blocks(), num_blocks);
    }
}

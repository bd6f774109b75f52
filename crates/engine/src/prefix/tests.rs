//! The prefix cache: hits, image keys, eviction, holds and its events.

use super::*;

fn tokens(n: u32, base: u32) -> Vec<u32> {
    (base..base + n).collect()
}

fn image(key: u64, span: Range<u32>) -> ItemKey {
    ItemKey { key, span }
}

#[test]
fn a_shared_prefix_is_cached_in_whole_blocks() {
    let cache = PrefixCache::new(4, 1024);
    let first = cache.admit(&tokens(10, 0), &[]);
    assert_eq!(first.cached_tokens, 0, "cold");
    assert_eq!(
        cache.len(),
        2,
        "two full blocks; the partial one is not cached"
    );
    let mut longer = tokens(10, 0);
    longer.extend([99, 98, 97, 96]);
    let second = cache.admit(&longer, &[]);
    assert_eq!(second.cached_tokens, 8, "the first two blocks hit");
    let other = cache.admit(&tokens(10, 1), &[]);
    assert_eq!(other.cached_tokens, 0, "another prefix shares nothing");
}

#[test]
fn images_key_their_blocks_so_different_images_never_match() {
    let cache = PrefixCache::new(4, 1024);
    // The same placeholder ids (7) for two different images.
    let prompt: Vec<u32> = [1, 2, 7, 7, 7, 7, 7, 7, 3, 4, 5, 6].to_vec();
    let a = [image(0xaaaa, 2..8)];
    let b = [image(0xbbbb, 2..8)];
    let _first = cache.admit(&prompt, &a);
    let other_image = cache.admit(&prompt, &b);
    assert_eq!(other_image.cached_tokens, 0, "another image: no hit");
    let same_image = cache.admit(&prompt, &a);
    assert_eq!(same_image.cached_tokens, 12, "the same image: every block");
}

#[test]
fn the_least_recently_used_unheld_blocks_are_evicted_tails_first() {
    let cache = PrefixCache::new(2, 6);
    drop(cache.admit(&tokens(4, 0), &[]));
    drop(cache.admit(&tokens(2, 100), &[]));
    assert_eq!(cache.len(), 3);
    // Two more blocks: the oldest prompt's tail goes first, then its head.
    drop(cache.admit(&tokens(4, 200), &[]));
    assert_eq!(cache.len(), 3);
    assert_eq!(cache.admit(&tokens(2, 100), &[]).cached_tokens, 2, "kept");
    assert_eq!(
        cache.admit(&tokens(4, 200), &[]).cached_tokens,
        4,
        "newest kept"
    );
    assert_eq!(cache.admit(&tokens(4, 0), &[]).cached_tokens, 0, "evicted");
}

#[test]
fn held_blocks_are_never_evicted() {
    let cache = PrefixCache::new(2, 4);
    let running = cache.admit(&tokens(4, 0), &[]);
    let full = cache.admit(&tokens(4, 50), &[]);
    assert_eq!(full.cached_tokens, 0);
    assert_eq!(cache.len(), 2, "no room: the new prompt is not stored");
    drop(full);
    assert_eq!(cache.admit(&tokens(4, 0), &[]).cached_tokens, 4);
    drop(running);
}

#[test]
fn every_change_is_a_numbered_batch_and_subscribers_resume() {
    let cache = PrefixCache::new(2, 4);
    drop(cache.admit(&tokens(4, 0), &[]));
    let (replay, _) = cache.subscribe(0);
    assert_eq!(replay.len(), 1, "the current state");
    assert_eq!(replay[0].events[0], KvEvent::Cleared);
    assert_eq!(replay[0].sequence, 1);
    let (_, mut live) = cache.subscribe(1);
    drop(cache.admit(&tokens(4, 10), &[]));
    let batch = live.try_recv().expect("published");
    assert_eq!(batch.sequence, 2);
    let KvEvent::Removed(removed) = &batch.events[0] else {
        panic!("eviction first: {:?}", batch.events);
    };
    assert_eq!(removed.len(), 2);
    let KvEvent::Stored { parent, blocks, .. } = &batch.events[1] else {
        panic!("then the stored blocks: {:?}", batch.events);
    };
    assert_eq!(*parent, None);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].token_ids, vec![10, 11]);
    // Resuming after 1 replays batch 2 exactly.
    let (replay, _) = cache.subscribe(1);
    assert_eq!(replay, vec![batch.clone()]);
    // A sequence from the future is a gap: the state again.
    let (replay, _) = cache.subscribe(99);
    assert_eq!(replay[0].events[0], KvEvent::Cleared);
}

#[test]
fn the_snapshot_lists_each_block_after_its_parent() {
    let cache = PrefixCache::new(2, 64);
    drop(cache.admit(&tokens(6, 0), &[]));
    let mut branch = tokens(2, 0);
    branch.extend([50, 51]);
    drop(cache.admit(&branch, &[]));
    let (replay, _) = cache.subscribe(0);
    let mut seen = std::collections::HashSet::new();
    for event in &replay[0].events[1..] {
        let KvEvent::Stored { parent, blocks, .. } = event else {
            panic!("{event:?}");
        };
        if let Some(parent) = parent {
            assert!(seen.contains(parent), "parent before child");
        }
        seen.extend(blocks.iter().map(|b| b.engine_hash));
    }
    assert_eq!(seen.len(), 4);
}

#[test]
fn clear_drops_what_no_request_holds() {
    let cache = PrefixCache::new(2, 64);
    let running = cache.admit(&tokens(2, 0), &[]);
    drop(cache.admit(&tokens(4, 10), &[]));
    cache.clear();
    assert_eq!(cache.len(), 1);
    drop(running);
    let (replay, _) = cache.subscribe(0);
    assert_eq!(replay[0].events.len(), 2, "Cleared and the held block");
}

#[test]
fn the_gateways_index_reads_the_events_with_the_same_keys() {
    let cache = PrefixCache::new(2, 64);
    let prompt = [1, 7, 7, 2, 3, 4];
    drop(cache.admit(&prompt, &[image(0xabcd, 1..3)]));
    let (replay, _) = cache.subscribe(0);
    let mut index: iris_kvindex::KvIndex<&str> = iris_kvindex::KvIndex::new(2);
    index.apply(&"engine", replay[0].sequence, &replay[0].events);
    let item = iris_kvindex::RequestItem {
        identifier: format!("{:016x}", 0xabcd),
        span: 1..3,
    };
    let keys = index.request_keys(&prompt, &[item]);
    assert_eq!(index.matched(&keys)[&"engine"], 3, "every block matches");
    let hashes: Vec<i64> = replay[0].events[1..]
        .iter()
        .flat_map(|e| match e {
            KvEvent::Stored { blocks, .. } => blocks.iter().map(|b| b.engine_hash).collect(),
            _ => Vec::new(),
        })
        .collect();
    let as_hashes: Vec<i64> = keys.iter().map(|k| *k as i64).collect();
    assert_eq!(
        hashes, as_hashes,
        "the engine's block hashes are the index's keys"
    );
}

#[test]
fn usage_counts_the_blocks_running_requests_hold() {
    let cache = PrefixCache::new(2, 8);
    assert_eq!(cache.usage(), 0.0);
    let running = cache.admit(&tokens(4, 0), &[]);
    assert_eq!(cache.usage(), 0.5, "two of four blocks held");
    drop(running);
    assert_eq!(cache.len(), 2, "still cached");
    assert_eq!(cache.usage(), 0.0, "but evictable: free for new work");
}

#[test]
fn an_adapters_blocks_are_its_own_and_say_so() {
    let cache = PrefixCache::new(2, 64);
    drop(cache.admit(&tokens(4, 0), &[]));
    let (_, mut live) = cache.subscribe(1);
    let sql = cache.admit_under(&tokens(4, 0), &[], Some("sql"));
    assert_eq!(
        sql.cached_tokens, 0,
        "the base model's blocks are not the adapter's"
    );
    let batch = live.try_recv().expect("published");
    let KvEvent::Stored { parent, lora, .. } = &batch.events[0] else {
        panic!("{:?}", batch.events);
    };
    assert_eq!((*parent, lora.as_deref()), (None, Some("sql")));
    let again = cache.admit_under(&tokens(4, 0), &[], Some("sql"));
    assert_eq!(again.cached_tokens, 4, "its own blocks hit");
    let chat = cache.admit_under(&tokens(4, 0), &[], Some("chat"));
    assert_eq!(chat.cached_tokens, 0);
    // The snapshot names each prompt's first block's adapter.
    let (replay, _) = cache.subscribe(0);
    let roots: Vec<Option<String>> = replay[0].events[1..]
        .iter()
        .filter_map(|event| match event {
            KvEvent::Stored {
                parent: None, lora, ..
            } => Some(lora.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(roots.len(), 3);
    for name in [None, Some("sql".to_owned()), Some("chat".to_owned())] {
        assert!(roots.contains(&name), "{name:?} in {roots:?}");
    }
}

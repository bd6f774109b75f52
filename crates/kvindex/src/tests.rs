//! The index against events shaped as an engine publishes them.

use super::*;

/// A `stored` event for `tokens` cut into blocks of `size` as a prompt is
/// ([`prompt_blocks`]), after `parent`, with engine hashes `first_hash..`;
/// `items` as a request would name them.
fn stored(
    parent: Option<i64>,
    tokens: &[u32],
    size: usize,
    first_hash: i64,
    items: &[RequestItem],
) -> Event {
    let blocks = prompt_blocks(size, tokens, items)
        .into_iter()
        .enumerate()
        .map(|(b, block)| StoredBlock {
            engine_hash: first_hash + b as i64,
            token_ids: block.token_ids,
            items: block.items,
        })
        .collect();
    Event::Stored {
        parent,
        blocks,
        lora: None,
    }
}

fn image(identifier: &str, span: Range<u32>) -> RequestItem {
    RequestItem {
        identifier: identifier.into(),
        span,
    }
}

const PROMPT: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

#[test]
fn a_request_matches_the_prefix_a_worker_stored() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    let events = [stored(None, &PROMPT[..6], 2, 100, &[])];
    assert_eq!(index.apply(&"a", 1, &events), Applied::Applied);
    let keys = index.request_keys(&PROMPT, &[]);
    assert_eq!(keys.len(), 4);
    assert_eq!(index.matched(&keys), HashMap::from([("a", 3)]));
    // Another prompt matches nothing; a shorter one matches its blocks.
    assert!(index
        .matched(&index.request_keys(&[9, 9, 9, 9], &[]))
        .is_empty());
    assert_eq!(
        index.matched(&index.request_keys(&PROMPT[..4], &[]))[&"a"],
        2
    );
}

#[test]
fn blocks_chain_from_their_parent_across_events() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    index.apply(&"a", 1, &[stored(None, &PROMPT[..2], 2, 100, &[])]);
    index.apply(&"a", 2, &[stored(Some(100), &PROMPT[2..6], 2, 200, &[])]);
    let keys = index.request_keys(&PROMPT, &[]);
    assert_eq!(index.matched(&keys)[&"a"], 3);
    // A parent never seen: the blocks cannot be keyed, and are counted.
    index.apply(&"b", 1, &[stored(Some(999), &PROMPT[2..6], 2, 300, &[])]);
    assert_eq!(index.worker_blocks(&"b"), 0);
    assert_eq!(index.skipped(&"b"), 2);
}

#[test]
fn images_of_the_same_size_never_match_each_other() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    // The same placeholder ids (7) for two different images.
    let prompt = [1, 7, 7, 7, 7, 2, 3, 4];
    let one = [image("aaaa", 1..5)];
    let two = [image("bbbb", 1..5)];
    index.apply(&"a", 1, &[stored(None, &prompt, 2, 100, &one)]);
    let same = index.request_keys(&prompt, &one);
    assert_eq!(index.matched(&same)[&"a"], 4, "the same image: every block");
    let other = index.request_keys(&prompt, &two);
    assert!(index.matched(&other).is_empty(), "another image: nothing");
    // The same image after the same prefix, other text after it.
    let mut longer = prompt.to_vec();
    longer[6] = 9;
    assert_eq!(index.matched(&index.request_keys(&longer, &one))[&"a"], 3);
}

#[test]
fn the_longest_holder_wins_and_removals_count() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    index.apply(&"a", 1, &[stored(None, &PROMPT[..4], 2, 100, &[])]);
    index.apply(&"b", 1, &[stored(None, &PROMPT, 2, 500, &[])]);
    let keys = index.request_keys(&PROMPT, &[]);
    assert_eq!(index.matched(&keys), HashMap::from([("a", 2), ("b", 4)]));
    index.apply(&"b", 2, &[Event::Removed(vec![501])]);
    assert_eq!(
        index.matched(&keys),
        HashMap::from([("a", 2), ("b", 1)]),
        "b lost its second block: its run stops there"
    );
    index.remove_worker(&"a");
    assert_eq!(index.matched(&keys), HashMap::from([("b", 1)]));
    assert_eq!(index.worker_blocks(&"a"), 0);
}

#[test]
fn a_gap_drops_the_worker_and_a_full_state_rebuilds_it() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    index.apply(&"a", 1, &[stored(None, &PROMPT[..4], 2, 100, &[])]);
    assert_eq!(index.apply(&"a", 1, &[]), Applied::Duplicate);
    let gap = index.apply(&"a", 5, &[Event::Removed(vec![100])]);
    assert_eq!(
        gap,
        Applied::Gap {
            expected: 2,
            got: 5
        }
    );
    assert!(index.is_empty(), "dropped until a full state arrives");
    let state = [Event::Cleared, stored(None, &PROMPT[..2], 2, 100, &[])];
    assert_eq!(index.apply(&"a", 7, &state), Applied::Applied);
    assert_eq!(index.worker_blocks(&"a"), 1);
    // A restart: the full state replaces what was there.
    let restarted = [Event::Cleared, stored(None, &[9, 9], 2, 100, &[])];
    assert_eq!(index.apply(&"a", 1, &restarted), Applied::Applied);
    let keys = index.request_keys(&PROMPT, &[]);
    assert!(index.matched(&keys).is_empty());
}

#[test]
fn blocks_of_another_size_are_skipped() {
    let mut index: KvIndex<&str> = KvIndex::new(4);
    index.apply(&"a", 1, &[stored(None, &PROMPT, 2, 100, &[])]);
    assert_eq!(index.worker_blocks(&"a"), 0);
    assert_eq!(index.skipped(&"a"), 4);
}

#[test]
fn blocks_stored_under_an_adapter_match_its_prompts_only() {
    let mut index: KvIndex<&str> = KvIndex::new(2);
    let Event::Stored { blocks, .. } = stored(None, &PROMPT[..4], 2, 100, &[]) else {
        unreachable!()
    };
    let under_sql = Event::Stored {
        parent: None,
        blocks,
        lora: Some("sql".into()),
    };
    index.apply(&"a", 1, &[under_sql]);
    // Its chain continues across events from the rooted parent.
    index.apply(&"a", 2, &[stored(Some(101), &PROMPT[4..6], 2, 200, &[])]);
    let sql = prompt_keys_under(2, &PROMPT, &[], Some(lora_root("sql")));
    assert_eq!(index.matched(&sql)[&"a"], 3);
    let chat = prompt_keys_under(2, &PROMPT, &[], Some(lora_root("chat")));
    assert!(index.matched(&chat).is_empty());
    assert!(index.matched(&index.request_keys(&PROMPT, &[])).is_empty());
    // The engine's own chain (prompt_blocks_under) is the same keys.
    let engine: Vec<BlockKey> = prompt_blocks_under(2, &PROMPT, &[], Some("sql"))
        .into_iter()
        .map(|b| b.key)
        .collect();
    assert_eq!(engine, sql);
    assert_ne!(lora_root("sql"), lora_root("chat"));
}

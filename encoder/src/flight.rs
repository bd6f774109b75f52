//! Single flight: an item whose content is already being computed (same
//! content hash, grid and dtype) joins that computation instead of being
//! queued again, and its room gets the same embedding. A gateway's retried
//! Encode of an image still in flight (after a timeout, to another room)
//! thus costs no second compute. Items without a content hash always
//! compute: nothing says they are the same.
//!
//! The embedding cache answers repeats of finished work; this answers
//! repeats of work still queued or running.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

use crate::compute::ImageInput;
use crate::validate::EncodeItem;

/// What makes two items the same work.
type FlightKey = (Bytes, [u32; 3], bool);

/// Computations in flight and the items waiting for each.
#[derive(Default)]
pub struct Flights {
    waiting: Mutex<HashMap<FlightKey, Vec<EncodeItem>>>,
}

fn key(item: &EncodeItem) -> Option<FlightKey> {
    if item.content_hash.is_empty() {
        return None;
    }
    Some((item.content_hash.clone(), item.input.grid, item.input.bf16))
}

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FlightKey, Vec<EncodeItem>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Splits `items` into those that lead a computation (to be queued;
    /// each now in flight) and the number that joined one already in
    /// flight (they wait for its [`Flights::land`]).
    pub fn board(&self, items: Vec<EncodeItem>) -> (Vec<EncodeItem>, usize) {
        let mut waiting = self.lock();
        let mut joined = 0;
        let leaders = items
            .into_iter()
            .filter_map(|item| {
                let Some(key) = key(&item) else {
                    return Some(item);
                };
                match waiting.get_mut(&key) {
                    Some(followers) => {
                        followers.push(without_pixels(item));
                        joined += 1;
                        None
                    }
                    None => {
                        waiting.insert(key, Vec::new());
                        Some(item)
                    }
                }
            })
            .collect();
        (leaders, joined)
    }

    /// Ends `leader`'s flight: the items that joined it, to be completed
    /// (or failed) with its outcome.
    pub fn land(&self, leader: &EncodeItem) -> Vec<EncodeItem> {
        match key(leader) {
            Some(key) => self.lock().remove(&key).unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Computations in flight that others may join.
    pub fn in_flight(&self) -> usize {
        self.lock().len()
    }
}

/// A joined item keeps its room, hash and grid, not its pixels (which
/// would otherwise stay in memory until the leader is done).
fn without_pixels(item: EncodeItem) -> EncodeItem {
    EncodeItem {
        input: ImageInput {
            pixels: Bytes::new(),
            ..item.input
        },
        ..item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(room: i64, hash: &'static [u8], grid: [u32; 3]) -> EncodeItem {
        EncodeItem {
            room,
            content_hash: Bytes::from_static(hash),
            input: ImageInput {
                pixels: Bytes::from(vec![1u8; 16]),
                bf16: false,
                grid,
            },
            recall: false,
        }
    }

    #[test]
    fn the_first_of_a_content_leads_and_the_rest_join_until_it_lands() {
        let flights = Flights::default();
        let (leaders, joined) = flights.board(vec![
            item(1, b"a", [1, 2, 2]),
            item(2, b"a", [1, 2, 2]),
            item(3, b"b", [1, 2, 2]),
            item(4, b"a", [1, 4, 4]),
            item(5, b"", [1, 2, 2]),
            item(6, b"", [1, 2, 2]),
        ]);
        let rooms: Vec<i64> = leaders.iter().map(|i| i.room).collect();
        assert_eq!(
            rooms,
            vec![1, 3, 4, 5, 6],
            "same hash, other grid: other work"
        );
        assert_eq!(joined, 1);
        let (again, joined) = flights.board(vec![item(7, b"a", [1, 2, 2])]);
        assert!(again.is_empty());
        assert_eq!(joined, 1);
        let followers = flights.land(&leaders[0]);
        let rooms: Vec<i64> = followers.iter().map(|i| i.room).collect();
        assert_eq!(rooms, vec![2, 7]);
        assert!(followers.iter().all(|f| f.input.pixels.is_empty()));
        assert!(flights.land(&leaders[0]).is_empty(), "landed once");
        let (after, _) = flights.board(vec![item(8, b"a", [1, 2, 2])]);
        assert_eq!(after.len(), 1, "a new flight once the first landed");
        assert_eq!(flights.in_flight(), 3);
    }
}

//! Stop strings over streamed text.
//!
//! Text arrives in pieces; a stop string may straddle pieces. [`StopMatcher`]
//! keeps back the shortest tail that could still grow into a stop string
//! and emits everything before it. When a stop string completes, it emits
//! the text before the stop (never the stop itself) and reports which stop
//! matched; everything after is dropped.
//!
//! When several stops match, the one that completes first (smallest end
//! offset) wins, as it would if text arrived one character at a time; among
//! stops completing at the same place the longest wins, so no part of any
//! matching stop is emitted. The held tail is always shorter than the
//! longest stop, so each push costs O((held + piece) × stops × longest stop)
//! at worst, which is small for the 16 stops a request may carry.

/// What one [`StopMatcher::push`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text safe to send to the client.
    pub emit: String,
    /// The stop string that ended the stream, if one matched now.
    pub stopped: Option<String>,
}

/// Finds stop strings across streamed pieces of text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    /// Distinct, non-empty stop strings.
    stops: Vec<String>,
    /// Longest stop, in bytes.
    max_len: usize,
    /// Text received but not yet emitted.
    held: String,
    /// Set once a stop has matched.
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings and duplicates are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let mut unique: Vec<String> = Vec::with_capacity(stops.len());
        for stop in stops {
            if !stop.is_empty() && !unique.contains(&stop) {
                unique.push(stop);
            }
        }
        let max_len = unique.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops: unique,
            max_len,
            held: String::new(),
            stopped: false,
        }
    }

    /// True when there are no stop strings (every push emits all its text).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// True once a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Adds a piece of text. After a stop has matched, returns nothing.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep::default();
        }
        if self.stops.is_empty() {
            return StopStep {
                emit: text.to_owned(),
                stopped: None,
            };
        }
        self.held.push_str(text);
        if let Some((start, index)) = self.first_match() {
            self.stopped = true;
            self.held.truncate(start);
            return StopStep {
                emit: std::mem::take(&mut self.held),
                stopped: Some(self.stops[index].clone()),
            };
        }
        let keep = self.partial_tail_len();
        let tail = self.held.split_off(self.held.len() - keep);
        StopStep {
            emit: std::mem::replace(&mut self.held, tail),
            stopped: None,
        }
    }

    /// Returns the held text at the end of the stream (nothing after a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The earliest-completing match in `held`: (start byte, stop index).
    fn first_match(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
        for (index, stop) in self.stops.iter().enumerate() {
            let Some(start) = self.held.find(stop.as_str()) else {
                continue;
            };
            let end = start + stop.len();
            let better = match best {
                None => true,
                Some((best_end, best_start, _)) => {
                    end < best_end || (end == best_end && start < best_start)
                }
            };
            if better {
                best = Some((end, start, index));
            }
        }
        best.map(|(_, start, index)| (start, index))
    }

    /// Length of the longest tail of `held` that is a proper prefix of a
    /// stop (0 if none). Always a char boundary.
    fn partial_tail_len(&self) -> usize {
        let longest = self.max_len.saturating_sub(1).min(self.held.len());
        (1..=longest)
            .rev()
            .find(|&k| self.tail_could_grow(k))
            .unwrap_or(0)
    }

    /// True when the last `k` bytes of `held` start some stop.
    fn tail_could_grow(&self, k: usize) -> bool {
        let at = self.held.len() - k;
        if !self.held.is_char_boundary(at) {
            return false;
        }
        let tail = &self.held[at..];
        self.stops
            .iter()
            .any(|stop| stop.len() > k && stop.starts_with(tail))
    }
}

//! `random`: uniformly at random, whatever the load.

use super::{Candidates, Policy};

pub struct Random;

impl Policy for Random {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        fastrand::usize(..among.len().max(1))
    }
}

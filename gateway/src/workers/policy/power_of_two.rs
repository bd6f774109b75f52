//! `power_of_two`: two candidates at random, the one with less load (the
//! first drawn on a tie).

use super::{Candidates, Policy};

pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn pick(&self, among: &Candidates<'_>) -> usize {
        let n = among.len();
        if n <= 1 {
            return 0;
        }
        let a = fastrand::usize(..n);
        let b = (a + 1 + fastrand::usize(..n - 1)) % n;
        if among.load(b) < among.load(a) {
            b
        } else {
            a
        }
    }
}

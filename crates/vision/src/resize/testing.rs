//! Test helpers of the resize passes: pseudo-random pixels and rows
//! handed out as a decoder hands them.

use super::streamed::RowSource;
use crate::decode::MAX_BATCH_ROWS;
use crate::error::VisionError;

/// `len` pseudo-random bytes from `seed` (xorshift).
pub(crate) fn noise(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 7) as u8
        })
        .collect()
}

/// Rows of an in-memory image, handed out in batches of cycling sizes
/// (1, 2, … `MAX_BATCH_ROWS`). It may claim more rows than `data` holds
/// (a source that ends early) or fail at its end (`bad_end`).
pub(crate) struct Memory<'a> {
    data: &'a [u8],
    width: usize,
    height: usize,
    row: usize,
    calls: usize,
    /// The check after the last row fails.
    pub(crate) bad_end: bool,
}

impl<'a> Memory<'a> {
    /// `data` as rows of `width` pixels, claiming `height` rows.
    pub(crate) fn new(data: &'a [u8], width: usize, height: usize) -> Self {
        Memory {
            data,
            width,
            height,
            row: 0,
            calls: 0,
            bad_end: false,
        }
    }
}

impl RowSource for Memory<'_> {
    fn width(&self) -> usize {
        self.width
    }

    fn height(&self) -> usize {
        self.height
    }

    fn read(&mut self, dst: &mut [u8]) -> Result<usize, VisionError> {
        let pitch = self.width * 3;
        let held = (self.data.len() / pitch).min(self.height);
        if self.row == held {
            return match self.bad_end {
                true => Err(VisionError::Geometry("corrupt end".into())),
                false => Ok(0),
            };
        }
        self.calls += 1;
        let rows = (self.calls % MAX_BATCH_ROWS + 1)
            .min(dst.len() / pitch)
            .min(held - self.row);
        dst[..rows * pitch].copy_from_slice(&self.data[self.row * pitch..][..rows * pitch]);
        self.row += rows;
        Ok(rows)
    }
}

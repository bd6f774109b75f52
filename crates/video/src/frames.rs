//! [`Frames`]: decoded RGB8 frames, packed one after the other.

/// Decoded frames, each `height` rows of `width` RGB8 pixels, in the order
/// they were requested.
#[derive(Debug, Clone, PartialEq)]
pub struct Frames {
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Number of frames in `data`.
    pub count: usize,
    /// `count × height × width × 3` bytes, row-major RGB.
    pub data: Vec<u8>,
    /// Presentation time of each frame in seconds from the stream start
    /// (PyAV's `frame.time`).
    pub timestamps_secs: Vec<f64>,
}

impl Frames {
    /// Bytes of one frame.
    pub fn frame_len(&self) -> usize {
        self.width as usize * self.height as usize * 3
    }

    /// The RGB bytes of frame `i` (`height × width × 3`).
    ///
    /// # Panics
    /// When `i >= self.count`, like slice indexing.
    pub fn frame(&self, i: usize) -> &[u8] {
        assert!(i < self.count, "frame {i} of {} frames", self.count);
        let len = self.frame_len();
        &self.data[i * len..(i + 1) * len]
    }

    /// Empty frames of `width`×`height` with room for `capacity` frames.
    pub(crate) fn with_capacity(width: u32, height: u32, capacity: usize) -> Self {
        let len = width as usize * height as usize * 3;
        Frames {
            width,
            height,
            count: 0,
            data: Vec::with_capacity(len.saturating_mul(capacity)),
            timestamps_secs: Vec::with_capacity(capacity),
        }
    }

    /// Appends one frame of `frame_len()` bytes.
    pub(crate) fn push(&mut self, rgb: &[u8], time_secs: f64) {
        debug_assert_eq!(rgb.len(), self.frame_len());
        self.data.extend_from_slice(rgb);
        self.timestamps_secs.push(time_secs);
        self.count += 1;
    }
}

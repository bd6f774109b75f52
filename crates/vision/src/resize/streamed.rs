//! Resizing rows as a decoder emits them.
//!
//! The horizontal pass filters each batch of decoded rows (at most
//! [`MAX_BATCH_ROWS`]) while it is still in cache, into the intermediate
//! image; as soon as the intermediate rows a band of output rows reads are
//! there, the vertical pass filters that band into a small per-thread
//! buffer and hands it to the consumer. The decoded image is never
//! materialised whole, and every intermediate row is read back shortly
//! after it was written. The arithmetic is the whole-image passes' own
//! (same functions, same kernels), so the result is identical.
//!
//! Applies when the vertical pass runs last and changes the height
//! ([`streams`]); the caller resizes the whole image otherwise.

use std::cell::Cell;

use super::kernel::{Bicubic, Kernel};
use super::{passes, PassOrder, WindowedResize, BAND};
use crate::decode::MAX_BATCH_ROWS;
use crate::error::VisionError;
use crate::image::RgbView;
use crate::scratch::ensure_len;

thread_local! {
    /// Images this thread resized from a row source.
    static STREAMED: Cell<u64> = const { Cell::new(0) };
}

/// How many images the calling thread has resized row by row as they were
/// decoded (the rest were decoded whole first): tests and diagnostics.
pub fn thread_streamed_images() -> u64 {
    STREAMED.with(Cell::get)
}

/// Where rows come from, top to bottom.
pub(crate) trait RowSource {
    /// Row width in pixels.
    fn width(&self) -> usize;
    /// Number of rows.
    fn height(&self) -> usize;
    /// Writes the next rows (RGB8, packed, at most [`MAX_BATCH_ROWS`] and
    /// as many as fit in `dst`) into `dst`; returns how many, at least one
    /// while rows are left. Once all rows are read, checks that the source
    /// ended cleanly and returns 0.
    fn read(&mut self, dst: &mut [u8]) -> Result<usize, VisionError>;
    /// Before the first row: hands out only (at least) the columns
    /// `columns` from now on, and returns the first one handed out
    /// ([`Self::width`] is then the new row width). By default every
    /// column stays: 0.
    fn crop_columns(&mut self, _columns: std::ops::Range<usize>) -> Result<usize, VisionError> {
        Ok(0)
    }
}

impl RowSource for crate::decode::RowDecoder<'_> {
    fn width(&self) -> usize {
        self.width()
    }

    fn height(&self) -> usize {
        self.height()
    }

    fn read(&mut self, dst: &mut [u8]) -> Result<usize, VisionError> {
        self.read(dst)
    }

    fn crop_columns(&mut self, columns: std::ops::Range<usize>) -> Result<usize, VisionError> {
        self.crop_columns(columns)
    }
}

/// Whether resizing `in_w`×`in_h` to `out_w`×`out_h` can consume rows as
/// they come: the vertical pass changes the height and runs last.
pub(crate) fn streams(input: (usize, usize), output: (usize, usize)) -> bool {
    streams_with(Bicubic::Pillow, input, output)
}

/// [`streams`] with `filter`'s pass order.
pub(crate) fn streams_with(
    filter: Bicubic,
    (in_w, in_h): (usize, usize),
    (_, out_h): (usize, usize),
) -> bool {
    out_h != in_h && PassOrder::of(filter, in_w, in_h, out_h) == PassOrder::HorizontalFirst
}

impl WindowedResize {
    /// Whether rows of a `input`-sized image can be resized as they come:
    /// [`streams_with`], and a window narrower than the image is cut by a
    /// horizontal pass (not a plain selection of columns).
    pub(crate) fn streams(&self, input: (usize, usize)) -> bool {
        let (left, top, width, height) = self.window;
        let (out_w, out_h) = self.size;
        let inside = width > 0 && height > 0 && left + width <= out_w && top + height <= out_h;
        let cut_by_pass = out_w != input.0 || (left, width) == (0, out_w);
        inside && cut_by_pass && streams_with(self.filter, input, self.size)
    }
}

/// Resizes the rows of `source` as `resize` says and hands the kept
/// window to `consume` in bands of up to 16 rows, each with the index of
/// its first row: the bytes [`super::resize_window`] gives for the decoded
/// image. Check [`WindowedResize::streams`] first.
pub(crate) fn resize_window_rows(
    source: &mut dyn RowSource,
    resize: &WindowedResize,
    scratch: (&mut Vec<u8>, &mut Vec<u8>),
    consume: impl FnMut(usize, RgbView<'_>),
) -> Result<(), VisionError> {
    let (in_w, in_h) = (source.width(), source.height());
    if !resize.streams((in_w, in_h)) {
        return Err(VisionError::Geometry(format!(
            "cannot stream a resize of {in_w}x{in_h} to {:?}",
            resize
        )));
    }
    let (left, top, width, height) = resize.window;
    let (out_w, out_h) = resize.size;
    let kh = match out_w != in_w {
        true => Some(columns_kernel(source, resize, left..left + width)?),
        false => None,
    };
    let kv = Kernel::cached_for(resize.filter, in_h, out_h).window(top..top + height);
    resize_rows_with(source, (kh.as_ref(), &kv), BAND_ROWS, scratch, consume)
}

/// The horizontal kernel of `resize`'s output columns `window`; when they
/// read only part of the row (a centre crop's), `source` is cropped to
/// those columns and the kernel's taps moved to match.
fn columns_kernel(
    source: &mut dyn RowSource,
    resize: &WindowedResize,
    window: std::ops::Range<usize>,
) -> Result<Kernel, VisionError> {
    let in_w = source.width();
    let kernel = Kernel::cached_for(resize.filter, in_w, resize.size.0).window(window);
    let reads = kernel.reads(0..kernel.out_size());
    if reads.len() == in_w {
        return Ok(kernel);
    }
    let first = source.crop_columns(reads.clone())?;
    let kept = first..first + source.width();
    if kept.start > reads.start || kept.end < reads.end {
        return Err(VisionError::Geometry(format!(
            "the row source kept columns {kept:?}, not {reads:?}"
        )));
    }
    Ok(kernel.shifted(kept))
}

/// Output rows per band of [`resize_window_rows`].
const BAND_ROWS: usize = 16;

/// Resizes the rows of `source` to `out_w`×`out_h` and hands the result to
/// `consume` in bands of `band_rows` rows, each with its chunk of `out`
/// (`out_band_len` elements per band), like `resize_banded`. `batch` and
/// `inter` are scratch buffers (`inter` holds a window of rows). Reads
/// `source` to its end, so a corrupt
/// tail is an error even when no output row depends on it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_rows<T>(
    source: &mut dyn RowSource,
    (out_w, out_h): (usize, usize),
    band_rows: usize,
    (batch, inter): (&mut Vec<u8>, &mut Vec<u8>),
    out: &mut [T],
    out_band_len: usize,
    consume: impl FnMut(RgbView<'_>, &mut [T]),
) -> Result<(), VisionError> {
    let (in_w, in_h) = (source.width(), source.height());
    if !streams((in_w, in_h), (out_w, out_h)) || out_w == 0 {
        return Err(VisionError::Geometry(format!(
            "cannot stream a resize of {in_w}x{in_h} to {out_w}x{out_h}"
        )));
    }
    let bands = out_h.div_ceil(band_rows.max(1));
    if out.len() != bands * out_band_len {
        return Err(VisionError::Geometry(format!(
            "{bands} bands of {out_band_len} elements do not fill {}",
            out.len()
        )));
    }
    let kh = (out_w != in_w).then(|| Kernel::cached(in_w, out_w));
    let kv = Kernel::cached(in_h, out_h);
    let kernels = (kh.as_deref(), &*kv);
    let mut chunks = out.chunks_mut(out_band_len.max(1));
    let mut consume = consume;
    resize_rows_with(source, kernels, band_rows, (batch, inter), |_, band| {
        if let Some(chunk) = chunks.next() {
            consume(band, chunk);
        }
    })
}

/// [`resize_rows`] with the kernels given: `kh` (none: the width stays)
/// and `kv` map the source's columns and rows to the output's, which may
/// be a window of a larger resize ([`Kernel::window`]). Each band goes to
/// `consume` with the index of its first output row.
fn resize_rows_with(
    source: &mut dyn RowSource,
    (kh, kv): (Option<&Kernel>, &Kernel),
    band_rows: usize,
    (batch, inter): (&mut Vec<u8>, &mut Vec<u8>),
    mut consume: impl FnMut(usize, RgbView<'_>),
) -> Result<(), VisionError> {
    let (in_w, in_h) = (source.width(), source.height());
    let out_w = kh.map_or(in_w, Kernel::out_size);
    let out_h = kv.out_size();
    if out_w == 0 || out_h == 0 || band_rows == 0 || kv.reads(0..out_h).end > in_h {
        return Err(VisionError::Geometry(format!(
            "cannot stream a resize of {in_w}x{in_h} to {out_w}x{out_h}"
        )));
    }
    let bands = out_h.div_ceil(band_rows);
    let row_len = out_w * 3;
    let band_span = |b: usize| {
        let first = b * band_rows;
        let last = (first + band_rows).min(out_h) - 1;
        let (end, weights) = kv.taps(last);
        (kv.taps(first).0, end + weights.len())
    };
    let widest = (0..bands)
        .map(band_span)
        .map(|(start, end)| end - start)
        .max()
        .unwrap_or(0);
    let mut window = Window {
        source,
        kh,
        batch,
        rows: inter,
        row_len,
        capacity: (2 * widest + MAX_BATCH_ROWS).min(in_h),
        base: 0,
        filled: 0,
    };
    ensure_len(window.rows, window.capacity * row_len);
    for b in 0..bands {
        let first = b * band_rows;
        let rows = band_rows.min(out_h - first);
        window.fill(band_span(b))?;
        passes::with_thread_buffer(&BAND, rows * row_len, |buf| {
            let held = (&window.rows[..], window.base);
            passes::vertical_rows(held, row_len, kv, first, buf);
            consume(first, RgbView::new(buf, out_w, rows)?);
            Ok::<(), VisionError>(())
        })?;
    }
    window.drain()?;
    count_streamed();
    Ok(())
}

/// Counts one more image resized from a row source on this thread
/// ([`thread_streamed_images`]).
pub(crate) fn count_streamed() {
    STREAMED.with(|n| n.set(n.get() + 1));
}

/// A sliding window of intermediate rows (source rows after the
/// horizontal pass), filled from the source a batch at a time. It holds
/// rows `base .. filled`; when the next band's rows would not fit, the rows
/// still needed move to the front. Small enough to stay in cache.
struct Window<'s, 'b> {
    source: &'s mut dyn RowSource,
    /// Horizontal kernel, `None` when the width does not change.
    kh: Option<&'b Kernel>,
    batch: &'b mut Vec<u8>,
    rows: &'b mut Vec<u8>,
    /// Bytes of one intermediate row.
    row_len: usize,
    /// Rows the window holds at most.
    capacity: usize,
    /// First row held.
    base: usize,
    /// One past the last row held (rows read from the source so far).
    filled: usize,
}

impl Window<'_, '_> {
    /// Makes the window hold rows `start .. end` (`start` never decreases
    /// from one call to the next).
    fn fill(&mut self, (start, end): (usize, usize)) -> Result<(), VisionError> {
        if end - self.base > self.capacity {
            // Rows are never skipped: neighbouring bands' windows overlap.
            let base = start.min(self.filled);
            let from = (base - self.base) * self.row_len;
            let to = (self.filled - self.base) * self.row_len;
            self.rows.copy_within(from..to, 0);
            self.base = base;
        }
        if end - self.base > self.capacity {
            return Err(VisionError::Geometry(format!(
                "rows {start}..{end} do not fit a window of {} rows",
                self.capacity
            )));
        }
        while self.filled < end {
            let room = self.capacity - (self.filled - self.base);
            let at = (self.filled - self.base) * self.row_len;
            let got = self.read(room, at)?;
            if got == 0 {
                return Err(VisionError::Geometry(format!(
                    "row source ended after {} of {} rows",
                    self.filled,
                    self.source.height()
                )));
            }
            self.filled += got;
        }
        Ok(())
    }

    /// Reads up to `room` source rows and stores them, filtered, at byte
    /// `at` of the window; returns how many.
    fn read(&mut self, room: usize, at: usize) -> Result<usize, VisionError> {
        let in_row = self.source.width() * 3;
        let want = room.min(MAX_BATCH_ROWS);
        let dst = &mut self.rows[at..at + want * self.row_len];
        match self.kh {
            // Same width: decode straight into the window.
            None => self.source.read(dst),
            Some(kh) => {
                ensure_len(self.batch, want * in_row);
                let got = self.source.read(self.batch)?;
                let src = &self.batch[..got * in_row];
                let in_w = self.source.width();
                passes::horizontal(src, in_w, kh, &mut dst[..got * self.row_len], false);
                Ok(got)
            }
        }
    }

    /// Reads the rows no band needs (unfiltered) and lets the source check
    /// its end.
    fn drain(self) -> Result<(), VisionError> {
        let in_row = self.source.width() * 3;
        ensure_len(self.batch, MAX_BATCH_ROWS * in_row);
        let mut filled = self.filled;
        while filled < self.source.height() {
            match self.source.read(self.batch)? {
                0 => {
                    return Err(VisionError::Geometry(format!(
                        "row source ended after {filled} of {} rows",
                        self.source.height()
                    )))
                }
                got => filled += got,
            }
        }
        match self.source.read(&mut [])? {
            0 => Ok(()),
            _ => Err(VisionError::Geometry(
                "row source has more rows than it declared".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resize::resize_into;
    use crate::resize::testing::Memory;

    fn noise(w: usize, h: usize) -> Vec<u8> {
        let mut s = (w * 31 + h * 7) as u32 | 1;
        (0..w * h * 3)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                s as u8
            })
            .collect()
    }

    /// The streamed resize, its bands copied out back to back.
    fn streamed(src: &mut Memory<'_>, out: (usize, usize), band_rows: usize) -> Vec<u8> {
        let bands = out.1.div_ceil(band_rows);
        let band_len = band_rows * out.0 * 3;
        let mut result = vec![0u8; bands * band_len];
        let (mut batch, mut inter) = (Vec::new(), Vec::new());
        resize_rows(
            src,
            out,
            band_rows,
            (&mut batch, &mut inter),
            &mut result,
            band_len,
            |band, chunk| chunk[..band.data().len()].copy_from_slice(band.data()),
        )
        .expect("streamed resize");
        result.truncate(out.0 * out.1 * 3);
        result
    }

    #[test]
    fn streamed_rows_equal_the_whole_image_resize() {
        let cases = [
            ((37, 23), (28, 56), 28),     // both axes, upscale rows
            ((333, 217), (336, 224), 28), // near 1, blocked horizontal pass
            ((1000, 41), (112, 17), 4),   // strong downscale both ways
            ((55, 300), (55, 97), 7),     // width unchanged: no horizontal pass
            ((13, 9), (5, 31), 5),        // last band shorter than the others
            ((1, 1), (3, 2), 1),
            ((20, 500), (24, 480), 1), // a window of 22 rows slides often
        ];
        for ((iw, ih), (ow, oh), band_rows) in cases {
            let data = noise(iw, ih);
            let view = RgbView::new(&data, iw, ih).expect("view");
            let (mut inter, mut full) = (Vec::new(), Vec::new());
            let expected = resize_into(view, ow, oh, &mut inter, &mut full, false)
                .expect("whole resize")
                .data()
                .to_vec();
            let before = thread_streamed_images();
            let got = streamed(&mut Memory::new(&data, iw, ih), (ow, oh), band_rows);
            assert!(got == expected, "{iw}x{ih} -> {ow}x{oh}");
            assert_eq!(thread_streamed_images(), before + 1);
        }
    }

    #[test]
    fn refuses_what_does_not_stream_and_reports_a_bad_end() {
        assert!(!streams((300, 200), (280, 200)), "height unchanged");
        assert!(!streams((20, 2500), (28, 2296)), "vertical pass first");
        assert!(streams((20, 2000), (28, 1960)));
        let data = noise(30, 20);
        let (mut batch, mut inter) = (Vec::new(), Vec::new());
        let mut out = vec![0u8; 28 * 20 * 3];
        let len = out.len();
        let mut same_height = Memory::new(&data, 30, 20);
        let refused = resize_rows(
            &mut same_height,
            (28, 20),
            20,
            (&mut batch, &mut inter),
            &mut out,
            len,
            |_, _| {},
        );
        assert!(matches!(refused, Err(VisionError::Geometry(_))));
        let mut bad = Memory::new(&data, 30, 20);
        bad.bad_end = true;
        let mut out = vec![0u8; 28 * 28 * 3];
        let len = out.len();
        let before = thread_streamed_images();
        let failed = resize_rows(
            &mut bad,
            (28, 28),
            28,
            (&mut batch, &mut inter),
            &mut out,
            len,
            |_, _| {},
        );
        assert!(matches!(failed, Err(VisionError::Geometry(m)) if m == "corrupt end"));
        assert_eq!(thread_streamed_images(), before);
    }
}

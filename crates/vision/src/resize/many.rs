//! Several resizes of one whole image, from one read of its rows: the
//! families whose frames are cut from more than one resize of the image
//! (LLaVA-NeXT's base tile and grid, InternVL's grid and thumbnail).
//!
//! Every resize runs horizontally first (Pillow's order for all but
//! images over 100 times taller than wide, PyTorch's always: [`shares_rows`]),
//! so each batch of source rows goes through every horizontal pass while
//! it is in cache, the transposing passes sharing one transpose per strip
//! ([`passes::horizontal_many`]) into a window of intermediate rows that
//! slides down with the batches; after each batch, every vertical pass
//! writes the output rows whose taps are all in, so each intermediate row
//! is read back while still in cache. The rows come from a decoder
//! ([`resize_many_rows`]: the decoded image is never stored) or from an
//! image decoded whole ([`resize_many`]). The passes and kernels are the
//! single resize's own, so each result is the bytes [`super::resize_with`]
//! gives.

use super::kernel::{Bicubic, Kernel};
use super::streamed::RowSource;
use super::{passes, PassOrder};
use crate::decode::MAX_BATCH_ROWS;
use crate::error::VisionError;
use crate::image::RgbView;
use crate::scratch::ensure_len;
use std::sync::Arc;

/// Whether `filter`'s resizes of an `input` (`(width, height)`) image to
/// each of `sizes` can share one pass over its rows: none is empty and
/// each runs horizontally first.
pub(crate) fn shares_rows(
    filter: Bicubic,
    (in_w, in_h): (usize, usize),
    sizes: &[(usize, usize)],
) -> bool {
    sizes.iter().all(|&(w, h)| {
        w > 0 && h > 0 && PassOrder::of(filter, in_w, in_h, h) == PassOrder::HorizontalFirst
    })
}

/// The kernels and buffer layout of resizing one image to several sizes.
struct Layout {
    in_w: usize,
    in_h: usize,
    sizes: Vec<(usize, usize)>,
    /// Horizontal kernels (`None`: the width stays).
    kh: Vec<Option<Arc<Kernel>>>,
    /// Vertical kernels (`None`: the height stays; the horizontal pass,
    /// or the copy, writes the output itself).
    kv: Vec<Option<Arc<Kernel>>>,
    /// Whether a size equal to the input's is copied into the output
    /// (from a decoder's rows) or left out (the caller has the image).
    copy_unchanged: bool,
    /// Intermediate rows each resize holds: every row (one pass over the
    /// whole image), or a window sliding down with the batches.
    window: usize,
}

/// Where a batched run is, per resize: the first source row its
/// intermediate window holds, and the output rows written.
struct Progress {
    base: Vec<usize>,
    done: Vec<usize>,
}

impl Layout {
    /// `sliding`: the rows come in batches of at most
    /// [`MAX_BATCH_ROWS`], and each intermediate image holds only the rows
    /// its next output rows read (a window that stays in cache).
    fn new(
        filter: Bicubic,
        (in_w, in_h): (usize, usize),
        sizes: &[(usize, usize)],
        copy_unchanged: bool,
        sliding: bool,
    ) -> Result<Layout, VisionError> {
        if !shares_rows(filter, (in_w, in_h), sizes) || in_w == 0 || in_h == 0 {
            return Err(VisionError::Geometry(format!(
                "cannot resize {in_w}x{in_h} to {sizes:?} in one pass over its rows"
            )));
        }
        let kernel = |input: usize, output: usize| {
            (input != output).then(|| Kernel::cached_for(filter, input, output))
        };
        let kv: Vec<_> = sizes.iter().map(|&(_, h)| kernel(in_h, h)).collect();
        // The next output row reads fewer than `ksize` rows already in,
        // and a batch adds at most MAX_BATCH_ROWS more.
        let taps = kv.iter().flatten().map(|k| k.ksize).max().unwrap_or(0);
        Ok(Layout {
            in_w,
            in_h,
            sizes: sizes.to_vec(),
            kh: sizes.iter().map(|&(w, _)| kernel(in_w, w)).collect(),
            kv,
            copy_unchanged,
            window: match sliding {
                true => in_h.min(taps + 2 * MAX_BATCH_ROWS),
                false => in_h,
            },
        })
    }

    /// A run before its first row.
    fn start(&self) -> Progress {
        Progress {
            base: vec![0; self.sizes.len()],
            done: vec![0; self.sizes.len()],
        }
    }

    /// Whether resize `i` is left out (the size is the input's and the
    /// caller has the image).
    fn skipped(&self, i: usize) -> bool {
        self.sizes[i] == (self.in_w, self.in_h) && !self.copy_unchanged
    }

    /// Bytes of each resize's intermediate window (none without a
    /// vertical pass).
    fn inter_lens(&self) -> Vec<usize> {
        let rows = |i: usize| match self.kv[i] {
            Some(_) => self.window,
            None => 0,
        };
        (0..self.sizes.len())
            .map(|i| self.sizes[i].0 * rows(i) * 3)
            .collect()
    }

    /// Bytes of each resized image in the output (none when skipped).
    fn out_lens(&self) -> Vec<usize> {
        let kept = |i: usize| !self.skipped(i);
        (0..self.sizes.len())
            .map(|i| usize::from(kept(i)) * self.sizes[i].0 * self.sizes[i].1 * 3)
            .collect()
    }

    /// The horizontal passes (or copies) of source rows `first ..`
    /// (`rows`, packed) into their rows of each intermediate window (slid
    /// down first when they would not fit), or of the output when the
    /// height stays.
    fn horizontal(
        &self,
        (rows, first): (&[u8], usize),
        (inter, out): (&mut [u8], &mut [u8]),
        at: &mut Progress,
        parallel: bool,
    ) -> Result<(), VisionError> {
        let count = rows.len() / (self.in_w * 3);
        let inters = split(inter, &self.inter_lens());
        let outs = split(out, &self.out_lens());
        let mut kernels = Vec::new();
        let mut dsts = Vec::new();
        for (i, (part, whole)) in inters.into_iter().zip(outs).enumerate() {
            if self.skipped(i) {
                continue;
            }
            let row = self.sizes[i].0 * 3;
            let (target, from) = match &self.kv[i] {
                Some(kv) => {
                    let from = self.slide((i, kv), (first, first + count), (part, row), at)?;
                    (part, from)
                }
                None => (whole, 0),
            };
            let dst = &mut target[(first - from) * row..(first + count - from) * row];
            match &self.kh[i] {
                Some(kh) => {
                    kernels.push(&**kh);
                    dsts.push(dst);
                }
                None => dst.copy_from_slice(rows),
            }
        }
        passes::horizontal_many(rows, self.in_w, &kernels, &mut dsts, parallel);
        Ok(())
    }

    /// Slides resize `i`'s intermediate `window` (rows of `row` bytes,
    /// filled up to source row `first`) so that it reaches row `end`,
    /// keeping the rows its next output row reads; returns the window's
    /// first row.
    fn slide(
        &self,
        (i, kv): (usize, &Kernel),
        (first, end): (usize, usize),
        (window, row): (&mut [u8], usize),
        at: &mut Progress,
    ) -> Result<usize, VisionError> {
        let base = at.base[i];
        if end - base <= self.window {
            return Ok(base);
        }
        let next = match at.done[i] < self.sizes[i].1 {
            true => kv.taps(at.done[i]).0,
            false => first,
        };
        let keep = next.clamp(base, first);
        window.copy_within((keep - base) * row..(first - base) * row, 0);
        at.base[i] = keep;
        if end - keep > self.window {
            return Err(VisionError::Geometry(format!(
                "source rows {keep}..{end} do not fit a window of {} rows",
                self.window
            )));
        }
        Ok(keep)
    }

    /// The vertical passes' output rows that read only the first
    /// `filled` source rows and are not written yet, from the
    /// intermediate windows in `inter` into `out`: run after each batch,
    /// they read intermediate rows still in cache.
    fn vertical_ready(&self, inter: &mut [u8], out: &mut [u8], filled: usize, at: &mut Progress) {
        let parts = split(inter, &self.inter_lens());
        let outs = split(out, &self.out_lens());
        for (i, (src, dst)) in parts.into_iter().zip(outs).enumerate() {
            let (w, h) = self.sizes[i];
            let done = at.done[i];
            let Some(kv) = &self.kv[i] else {
                at.done[i] = filled.min(h);
                continue;
            };
            let ready = (done..h)
                .find(|&y| {
                    let (start, taps) = kv.taps(y);
                    start + taps.len() > filled
                })
                .unwrap_or(h);
            if ready > done {
                let rows = &mut dst[done * w * 3..ready * w * 3];
                passes::vertical_rows((src, at.base[i]), w * 3, kv, done, rows);
                at.done[i] = ready;
            }
        }
    }

    /// Refuses a run whose vertical passes did not write every row.
    fn check_done(&self, at: &Progress) -> Result<(), VisionError> {
        let heights: Vec<usize> = self.sizes.iter().map(|&(_, h)| h).collect();
        if at.done != heights {
            return Err(VisionError::Geometry(format!(
                "resized rows {:?} of {heights:?} after every source row",
                at.done
            )));
        }
        Ok(())
    }

    /// Every vertical pass, from whole intermediate images in `inter`
    /// into `out`.
    fn vertical(&self, inter: &mut [u8], out: &mut [u8], parallel: bool) {
        let parts = split(inter, &self.inter_lens());
        let outs = split(out, &self.out_lens());
        for (i, (src, dst)) in parts.into_iter().zip(outs).enumerate() {
            if let Some(kv) = &self.kv[i] {
                passes::vertical(src, self.sizes[i].0 * 3, kv, dst, parallel);
            }
        }
    }

    /// Sizes `inter` and `out` for every resize.
    fn buffers(&self, inter: &mut Vec<u8>, out: &mut Vec<u8>) {
        ensure_len(inter, self.inter_lens().iter().sum());
        ensure_len(out, self.out_lens().iter().sum());
    }
}

/// `buf` cut into consecutive parts of `lens` bytes.
fn split<'a>(mut buf: &'a mut [u8], lens: &[usize]) -> Vec<&'a mut [u8]> {
    lens.iter()
        .map(|&len| {
            let (part, rest) = std::mem::take(&mut buf).split_at_mut(len);
            buf = rest;
            part
        })
        .collect()
}

/// Resizes the rows of `source` to each of `sizes` with `filter`, into
/// `out`, one image after the other ([`views`]); `batch` and `inter` are
/// scratch. Reads `source` to its end. Check [`shares_rows`] first.
pub(crate) fn resize_many_rows(
    source: &mut dyn RowSource,
    filter: Bicubic,
    sizes: &[(usize, usize)],
    (batch, inter, out): (&mut Vec<u8>, &mut Vec<u8>, &mut Vec<u8>),
) -> Result<(), VisionError> {
    let layout = Layout::new(filter, (source.width(), source.height()), sizes, true, true)?;
    layout.buffers(inter, out);
    let in_row = layout.in_w * 3;
    ensure_len(batch, MAX_BATCH_ROWS * in_row);
    let mut at = layout.start();
    let mut filled = 0;
    while filled < layout.in_h {
        let got = source.read(batch)?;
        if got == 0 {
            return Err(VisionError::Geometry(format!(
                "row source ended after {filled} of {} rows",
                layout.in_h
            )));
        }
        let rows = (&batch[..got * in_row], filled);
        layout.horizontal(rows, (inter, out), &mut at, false)?;
        filled += got;
        layout.vertical_ready(inter, out, filled, &mut at);
    }
    if source.read(batch)? != 0 {
        return Err(VisionError::Geometry(format!(
            "row source gave more than its {} rows",
            layout.in_h
        )));
    }
    layout.check_done(&at)?;
    super::streamed::count_streamed();
    Ok(())
}

/// [`resize_many_rows`] from an image decoded whole, the passes split
/// across threads when `parallel`; a size equal to the image's is left
/// out of `out` ([`views`] gives the image for it).
pub(crate) fn resize_many(
    image: RgbView<'_>,
    filter: Bicubic,
    sizes: &[(usize, usize)],
    (inter, out): (&mut Vec<u8>, &mut Vec<u8>),
    parallel: bool,
) -> Result<(), VisionError> {
    let input = (image.width(), image.height());
    let layout = Layout::new(filter, input, sizes, false, !parallel)?;
    layout.buffers(inter, out);
    let mut at = layout.start();
    if parallel {
        layout.horizontal((image.data(), 0), (inter, out), &mut at, true)?;
        layout.vertical(inter, out, true);
        return Ok(());
    }
    let in_row = layout.in_w * 3;
    for (i, rows) in image.data().chunks(MAX_BATCH_ROWS * in_row).enumerate() {
        let first = i * MAX_BATCH_ROWS;
        layout.horizontal((rows, first), (inter, out), &mut at, false)?;
        layout.vertical_ready(inter, out, first + rows.len() / in_row, &mut at);
    }
    layout.check_done(&at)
}

/// The images [`resize_many_rows`] left in `out`, or [`resize_many`]
/// with `image`: a size equal to the image's is the image itself.
pub(crate) fn views<'a>(
    out: &'a [u8],
    sizes: &[(usize, usize)],
    image: Option<RgbView<'a>>,
) -> Result<Vec<RgbView<'a>>, VisionError> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&(w, h)| {
            if let Some(image) = image.filter(|i| (i.width(), i.height()) == (w, h)) {
                return Ok(image);
            }
            let len = w * h * 3;
            let view = out
                .get(at..at + len)
                .ok_or_else(|| VisionError::Geometry(format!("no {w}x{h} image at byte {at}")))
                .and_then(|bytes| RgbView::new(bytes, w, h));
            at += len;
            view
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resize::resize_with;
    use crate::resize::testing::{noise, Memory};

    #[test]
    fn every_resize_equals_its_own_resize() {
        type Case = ((usize, usize), &'static [(usize, usize)]);
        let cases: [Case; 4] = [
            ((1920, 1080), &[(336, 336), (672, 378)]),
            ((1000, 700), &[(448, 448), (1344, 896), (1000, 350)]),
            ((333, 217), &[(336, 224), (333, 100), (50, 217)]),
            ((64, 48), &[(64, 48), (17, 5)]),
        ];
        for filter in [Bicubic::Pillow, Bicubic::Torch] {
            for (seed, &((w, h), sizes)) in cases.iter().enumerate() {
                let data = noise(w * h * 3, seed as u32 + 1);
                let image = RgbView::new(&data, w, h).unwrap();
                let mut expected = Vec::new();
                for &size in sizes {
                    let (mut inter, mut out) = (Vec::new(), Vec::new());
                    let one = resize_with(filter, image, size, (&mut inter, &mut out), false);
                    expected.extend_from_slice(one.unwrap().data());
                }
                for parallel in [false, true] {
                    let (mut inter, mut out) = (Vec::new(), Vec::new());
                    resize_many(image, filter, sizes, (&mut inter, &mut out), parallel).unwrap();
                    let views = views(&out, sizes, Some(image)).unwrap();
                    let got: Vec<u8> = views.iter().flat_map(|v| v.data().to_vec()).collect();
                    assert_eq!(got, expected, "{filter:?} {w}x{h} → {sizes:?} whole");
                }
                // Batches of 1, 2, … 16 rows in turn.
                let mut rows = Memory::new(&data, w, h);
                let (mut batch, mut inter, mut out) = (Vec::new(), Vec::new(), Vec::new());
                let scratch = (&mut batch, &mut inter, &mut out);
                resize_many_rows(&mut rows, filter, sizes, scratch).unwrap();
                assert_eq!(out, expected, "{filter:?} {w}x{h} → {sizes:?} by rows");
                assert_eq!(views(&out, sizes, None).unwrap().len(), sizes.len());
            }
        }
    }

    #[test]
    fn refuses_a_short_source_and_a_vertical_first_resize() {
        let data = noise(40 * 30 * 3, 5);
        let mut rows = Memory::new(&data, 40, 31);
        let (mut batch, mut inter, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let scratch = (&mut batch, &mut inter, &mut out);
        let short = resize_many_rows(&mut rows, Bicubic::Pillow, &[(20, 15)], scratch);
        let message = short.unwrap_err().to_string();
        assert!(message.contains("ended after 30 of 31 rows"), "{message}");
        // 1 × 200 is over 100:1: Pillow resizes it vertically first.
        assert!(!shares_rows(Bicubic::Pillow, (1, 200), &[(1, 50)]));
        assert!(shares_rows(Bicubic::Torch, (1, 200), &[(1, 50)]));
        assert!(!shares_rows(Bicubic::Pillow, (10, 10), &[(0, 5)]));
    }
}

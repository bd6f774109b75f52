//! Pillow-exact BICUBIC resize of RGB8 images (Pillow 12.2.0 semantics).
//!
//! Separable: one pass per axis with an 8-bit image in between; a pass whose
//! size does not change is skipped. Like Pillow 12.2, the horizontal pass
//! runs first, except for images more than 100 times taller than wide, which
//! Pillow 12.2 resizes vertically first (checked against Pillow in
//! `scripts/vision/reference.py`).

mod hblock;
mod kernel;
#[cfg(target_arch = "x86_64")]
mod madd;
mod many;
mod passes;
mod streamed;
mod strip;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(target_arch = "x86_64")]
mod vmadd;

use crate::error::VisionError;
use crate::image::RgbView;
use crate::scratch::ensure_len;
pub use kernel::Bicubic;
use kernel::Kernel;
pub(crate) use many::{resize_many, resize_many_rows, shares_rows, views};
use rayon::prelude::*;
use std::cell::Cell;
pub use streamed::thread_streamed_images;
pub(crate) use streamed::{resize_rows, resize_window_rows, streams, RowSource};

/// Which axis Pillow 12.2 filters first for an `in_w`×`in_h` source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOrder {
    /// Horizontal, then vertical (the usual case).
    HorizontalFirst,
    /// Vertical, then horizontal (sources taller than 100:1).
    VerticalFirst,
}

impl PassOrder {
    /// `filter`'s choice: Pillow's below, PyTorch always horizontal first.
    pub fn of(filter: Bicubic, in_w: usize, in_h: usize, out_h: usize) -> PassOrder {
        match filter {
            Bicubic::Pillow | Bicubic::PillowBilinear | Bicubic::PillowLanczos => {
                PassOrder::pillow_12_2(in_w, in_h, out_h)
            }
            Bicubic::Torch | Bicubic::TorchBilinear => PassOrder::HorizontalFirst,
        }
    }

    /// Pillow 12.2's choice for resizing `in_w`×`in_h` to height `out_h`.
    pub fn pillow_12_2(in_w: usize, in_h: usize, out_h: usize) -> PassOrder {
        if in_h > in_w.saturating_mul(100) && out_h < in_h {
            PassOrder::VerticalFirst
        } else {
            PassOrder::HorizontalFirst
        }
    }
}

/// Resizes `src` to `out_w`×`out_h` into `out` (using `inter` for the
/// intermediate image) and returns a view of the result. When the size does
/// not change, returns `src` untouched.
pub(crate) fn resize_into<'a>(
    src: RgbView<'a>,
    out_w: usize,
    out_h: usize,
    inter: &'a mut Vec<u8>,
    out: &'a mut Vec<u8>,
    parallel: bool,
) -> Result<RgbView<'a>, VisionError> {
    resize_with(Bicubic::Pillow, src, (out_w, out_h), (inter, out), parallel)
}

/// [`resize_into`] with `filter`'s weights and pass order.
pub(crate) fn resize_with<'a>(
    filter: Bicubic,
    src: RgbView<'a>,
    (out_w, out_h): (usize, usize),
    (inter, out): (&'a mut Vec<u8>, &'a mut Vec<u8>),
    parallel: bool,
) -> Result<RgbView<'a>, VisionError> {
    let kernel = |i, o| Kernel::cached_for(filter, i, o);
    let (in_w, in_h) = (src.width(), src.height());
    if out_w == 0 || out_h == 0 {
        return Err(VisionError::Geometry(format!(
            "cannot resize {in_w}x{in_h} to {out_w}x{out_h}"
        )));
    }
    let need_h = out_w != in_w;
    let need_v = out_h != in_h;
    match (need_h, need_v) {
        (false, false) => Ok(src),
        (true, false) => {
            ensure_len(out, out_w * in_h * 3);
            passes::horizontal(src.data(), in_w, &kernel(in_w, out_w), out, parallel);
            RgbView::new(out, out_w, out_h)
        }
        (false, true) => {
            ensure_len(out, in_w * out_h * 3);
            passes::vertical(src.data(), in_w * 3, &kernel(in_h, out_h), out, parallel);
            RgbView::new(out, out_w, out_h)
        }
        (true, true) => {
            let kh = kernel(in_w, out_w);
            let kv = kernel(in_h, out_h);
            ensure_len(out, out_w * out_h * 3);
            match PassOrder::of(filter, in_w, in_h, out_h) {
                PassOrder::HorizontalFirst => {
                    ensure_len(inter, out_w * in_h * 3);
                    passes::horizontal(src.data(), in_w, &kh, inter, parallel);
                    passes::vertical(inter, out_w * 3, &kv, out, parallel);
                }
                PassOrder::VerticalFirst => {
                    ensure_len(inter, in_w * out_h * 3);
                    passes::vertical(src.data(), in_w * 3, &kv, inter, parallel);
                    passes::horizontal(inter, in_w, &kh, out, parallel);
                }
            }
            RgbView::new(out, out_w, out_h)
        }
    }
}

/// One resize of a whole image, of which a window is kept (a centre crop
/// after a shortest-edge resize, or the whole of it): computed alone from
/// a decoded image ([`resize_window`]) or from a decoder's rows
/// ([`resize_window_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowedResize {
    pub(crate) filter: Bicubic,
    /// The whole resize's `(width, height)`.
    pub(crate) size: (usize, usize),
    /// The part kept: `(left, top, width, height)` of the resize.
    pub(crate) window: (usize, usize, usize, usize),
}

impl WindowedResize {
    /// The whole resize kept.
    pub(crate) fn whole(filter: Bicubic, size: (usize, usize)) -> Self {
        WindowedResize {
            filter,
            size,
            window: (0, 0, size.0, size.1),
        }
    }
}

/// `resize`'s window of `src`, computed alone into `out` (`inter` holds
/// the intermediate rows): each window pixel takes the whole resize's
/// weights, in the whole resize's pass order, so the bytes are those of
/// resizing whole and cropping, for the window's columns and the rows its
/// taps read only.
pub(crate) fn resize_window<'a>(
    resize: &WindowedResize,
    src: RgbView<'_>,
    (inter, out): (&'a mut Vec<u8>, &'a mut Vec<u8>),
    parallel: bool,
) -> Result<RgbView<'a>, VisionError> {
    let WindowedResize {
        filter,
        size: (out_w, out_h),
        window: (left, top, width, height),
    } = *resize;
    let (in_w, in_h) = (src.width(), src.height());
    if width == 0 || height == 0 || left + width > out_w || top + height > out_h {
        return Err(VisionError::Geometry(format!(
            "window {width}x{height}+{left}+{top} outside the {out_w}x{out_h} resize"
        )));
    }
    let (cols, rows) = (left..left + width, top..top + height);
    // An axis that keeps its size is a selection, not a pass.
    let kh = (out_w != in_w).then(|| Kernel::cached_for(filter, in_w, out_w).window(cols.clone()));
    let kv = (out_h != in_h).then(|| Kernel::cached_for(filter, in_h, out_h));
    let order = match (&kh, &kv) {
        (Some(_), Some(_)) => PassOrder::of(filter, in_w, in_h, out_h),
        _ => PassOrder::HorizontalFirst,
    };
    ensure_len(out, width * height * 3);
    match order {
        PassOrder::HorizontalFirst => {
            // The source rows the window's output rows read.
            let read = kv
                .as_ref()
                .map_or(rows.clone(), |kv| kv.reads(rows.clone()));
            let band = &src.data()[read.start * in_w * 3..read.end * in_w * 3];
            ensure_len(inter, width * read.len() * 3);
            match &kh {
                Some(kh) => passes::horizontal(band, in_w, kh, inter, parallel),
                None => select_columns(band, in_w, cols, inter),
            }
            match &kv {
                Some(kv) => passes::vertical_rows((inter, read.start), width * 3, kv, top, out),
                None => out.copy_from_slice(&inter[..width * height * 3]),
            }
        }
        PassOrder::VerticalFirst => {
            ensure_len(inter, in_w * height * 3);
            if let Some(kv) = &kv {
                passes::vertical_rows((src.data(), 0), in_w * 3, kv, top, inter);
            }
            if let Some(kh) = &kh {
                passes::horizontal(inter, in_w, kh, out, parallel);
            }
        }
    }
    RgbView::new(out, width, height)
}

/// Columns `cols` of every row of `src` (rows of `in_w` pixels) into `out`.
fn select_columns(src: &[u8], in_w: usize, cols: std::ops::Range<usize>, out: &mut [u8]) {
    let width = cols.len() * 3;
    for (row, dst) in src.chunks_exact(in_w * 3).zip(out.chunks_exact_mut(width)) {
        dst.copy_from_slice(&row[cols.start * 3..cols.end * 3]);
    }
}

/// Resizes `src` with `filter` into `out` (a copy when the size does not
/// change), using `inter` for the intermediate image.
pub(crate) fn resize_copy(
    filter: Bicubic,
    src: RgbView<'_>,
    (out_w, out_h): (usize, usize),
    inter: &mut Vec<u8>,
    out: &mut Vec<u8>,
    parallel: bool,
) -> Result<(), VisionError> {
    if (out_w, out_h) == (src.width(), src.height()) {
        out.clear();
        out.extend_from_slice(src.data());
        return Ok(());
    }
    resize_with(filter, src, (out_w, out_h), (inter, out), parallel)?;
    out.truncate(out_w * out_h * 3);
    Ok(())
}

/// Bytes of the buffers resizing `in_w`×`in_h` to `out_w`×`out_h` takes
/// at most: the intermediate pass (either order), the full result (the
/// fused path writes only bands of it) and the two kernels (per output
/// sample: its start, length, taps and their blocked copy).
pub(crate) fn working_bytes((in_w, in_h): (u64, u64), (out_w, out_h): (u64, u64)) -> u64 {
    if (in_w, in_h) == (out_w, out_h) {
        return 0;
    }
    let kernel = |input: u64, output: u64| {
        let taps = 4 * input.div_ceil(output.max(1)).max(1) + 1;
        output * (64 + 16 * taps)
    };
    let inter = (out_w * in_h).max(in_w * out_h);
    3 * (inter + out_w * out_h) + kernel(in_w, out_w) + kernel(in_h, out_h)
}

thread_local! {
    /// Per-thread buffer holding one band of resized rows (recycled).
    static BAND: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Resizes `src` to `out_w`×`out_h` like [`resize_into`] and hands the
/// result to `consume` in bands of `band_rows` rows, each with its chunk of
/// `out` (`out_band_len` elements per band; `out` must hold exactly one
/// chunk per band).
///
/// When the vertical pass runs last (the usual case) it is fused with the
/// consumer: each band's rows are filtered into a small per-thread buffer
/// and consumed while still in cache, so the full resized image is never
/// written out. Other cases resize fully first (into `full`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_banded<T, F>(
    src: RgbView<'_>,
    (out_w, out_h): (usize, usize),
    band_rows: usize,
    (inter, full): (&mut Vec<u8>, &mut Vec<u8>),
    out: &mut [T],
    out_band_len: usize,
    parallel: bool,
    consume: F,
) -> Result<(), VisionError>
where
    T: Send,
    F: Fn(RgbView<'_>, &mut [T]) + Sync,
{
    let (in_w, in_h) = (src.width(), src.height());
    let bands = out_h.div_ceil(band_rows.max(1));
    if out_w == 0 || out_h == 0 || band_rows == 0 || out.len() != bands * out_band_len {
        return Err(VisionError::Geometry(format!(
            "cannot resize {in_w}x{in_h} to {out_w}x{out_h} in bands of {band_rows} rows \
             into {} elements",
            out.len()
        )));
    }
    let row_len = out_w * 3;
    let rows_of = |b: usize| band_rows.min(out_h - b * band_rows);
    let fused =
        out_h != in_h && PassOrder::pillow_12_2(in_w, in_h, out_h) == PassOrder::HorizontalFirst;
    if !fused {
        let resized = resize_into(src, out_w, out_h, inter, full, parallel)?.data();
        return for_each_band(out, out_band_len, parallel, |b, chunk| {
            let rows = &resized[b * band_rows * row_len..][..rows_of(b) * row_len];
            consume(RgbView::new(rows, out_w, rows_of(b))?, chunk);
            Ok(())
        });
    }
    let vsrc: &[u8] = if out_w != in_w {
        ensure_len(inter, row_len * in_h);
        let kh = Kernel::cached(in_w, out_w);
        passes::horizontal(src.data(), in_w, &kh, inter, parallel);
        inter
    } else {
        src.data()
    };
    let kv = Kernel::cached(in_h, out_h);
    for_each_band(out, out_band_len, parallel, |b, chunk| {
        let rows = rows_of(b);
        passes::with_thread_buffer(&BAND, rows * row_len, |buf| {
            passes::vertical_rows((vsrc, 0), row_len, &kv, b * band_rows, buf);
            consume(RgbView::new(buf, out_w, rows)?, chunk);
            Ok(())
        })
    })
}

/// Runs `f(band index, chunk)` over the `band_len`-element chunks of `out`.
fn for_each_band<T: Send>(
    out: &mut [T],
    band_len: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) -> Result<(), VisionError> + Sync,
) -> Result<(), VisionError> {
    if band_len == 0 {
        return Ok(());
    }
    if parallel {
        out.par_chunks_mut(band_len)
            .enumerate()
            .try_for_each(|(b, chunk)| f(b, chunk))
    } else {
        out.chunks_mut(band_len)
            .enumerate()
            .try_for_each(|(b, chunk)| f(b, chunk))
    }
}

/// Resizes an image with Pillow 12.2.0's BICUBIC filter, bit-exactly.
pub fn resize_bicubic(
    src: &image::RgbImage,
    out_w: u32,
    out_h: u32,
) -> Result<image::RgbImage, VisionError> {
    resize_bicubic_with(Bicubic::Pillow, src, out_w, out_h)
}

/// Resizes an image with `filter`'s BICUBIC, bit-exactly: Pillow 12.2.0's,
/// or PyTorch 2.9's antialiased `uint8` resize (torchvision's `resize`).
pub fn resize_bicubic_with(
    filter: Bicubic,
    src: &image::RgbImage,
    out_w: u32,
    out_h: u32,
) -> Result<image::RgbImage, VisionError> {
    let view = RgbView::from_image(src)?;
    let (mut inter, mut out) = (Vec::new(), Vec::new());
    let size = (out_w as usize, out_h as usize);
    resize_with(filter, view, size, (&mut inter, &mut out), false)?.to_image()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: u32, h: u32) -> image::RgbImage {
        image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([
                (x * 7 + y * 3) as u8,
                (x * x + y) as u8,
                255u32.wrapping_sub(x).wrapping_sub(y * 2) as u8,
            ])
        })
    }

    #[test]
    fn same_size_is_identity() {
        let img = gradient(17, 9);
        assert_eq!(resize_bicubic(&img, 17, 9).unwrap(), img);
    }

    #[test]
    fn flat_image_stays_flat() {
        let img = image::RgbImage::from_pixel(33, 21, image::Rgb([10, 128, 250]));
        let out = resize_bicubic(&img, 14, 50).unwrap();
        assert!(out.pixels().all(|p| p.0 == [10, 128, 250]));
    }

    #[test]
    fn parallel_matches_sequential() {
        let img = gradient(300, 200);
        let view = RgbView::from_image(&img).unwrap();
        let (mut a1, mut b1, mut a2, mut b2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let seq = resize_into(view, 123, 77, &mut a1, &mut b1, false)
            .unwrap()
            .data()
            .to_vec();
        let par = resize_into(view, 123, 77, &mut a2, &mut b2, true)
            .unwrap()
            .data()
            .to_vec();
        assert_eq!(seq, par);
    }

    /// A window of the resize is the whole resize cropped, byte for byte:
    /// shrinking and growing, each filter, both pass orders, an axis that
    /// keeps its size, and windows at the edges.
    #[test]
    fn a_window_is_the_whole_resize_cropped() {
        let noisy = |w: u32, h: u32| {
            let mut state = 0x2545_f491u32;
            image::RgbImage::from_fn(w, h, |_, _| {
                let mut next = || {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                };
                image::Rgb([next(), next(), next()])
            })
        };
        let cases = [
            ((640, 360), (597, 336), (130, 0, 336, 336)),
            ((300, 700), (336, 784), (0, 224, 336, 336)),
            ((80, 60), (200, 150), (3, 7, 50, 40)),
            ((120, 90), (120, 45), (10, 5, 60, 30)),
            ((120, 90), (60, 90), (0, 0, 60, 90)),
            ((20, 2500), (10, 1250), (2, 600, 8, 100)),
            ((64, 48), (64, 48), (8, 8, 16, 16)),
        ];
        for filter in [Bicubic::Pillow, Bicubic::PillowBilinear, Bicubic::Torch] {
            for ((iw, ih), (ow, oh), (left, top, w, h)) in cases {
                let img = noisy(iw, ih);
                let view = RgbView::from_image(&img).unwrap();
                let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let whole = resize_with(filter, view, (ow, oh), (&mut a, &mut b), false).unwrap();
                let mut cropped = Vec::new();
                whole.crop_into(left, top, w, h, &mut cropped).unwrap();
                let resize = WindowedResize {
                    filter,
                    size: (ow, oh),
                    window: (left, top, w, h),
                };
                let window = resize_window(&resize, view, (&mut c, &mut d), true).unwrap();
                assert_eq!((window.width(), window.height()), (w, h));
                assert!(
                    window.data() == &cropped[..],
                    "{filter:?} {iw}x{ih} -> {ow}x{oh}, window {w}x{h}+{left}+{top}"
                );
            }
        }
        let img = noisy(10, 10);
        let view = RgbView::from_image(&img).unwrap();
        let (mut c, mut d) = (Vec::new(), Vec::new());
        let outside = WindowedResize {
            filter: Bicubic::Pillow,
            size: (5, 5),
            window: (3, 0, 3, 5),
        };
        let outside = resize_window(&outside, view, (&mut c, &mut d), false);
        assert!(outside.is_err());
    }

    #[test]
    fn pass_order_switches_above_100_to_1() {
        assert_eq!(
            PassOrder::pillow_12_2(20, 2000, 1960),
            PassOrder::HorizontalFirst
        );
        assert_eq!(
            PassOrder::pillow_12_2(20, 2001, 1960),
            PassOrder::VerticalFirst
        );
        assert_eq!(
            PassOrder::pillow_12_2(28, 3000, 3008),
            PassOrder::HorizontalFirst
        );
    }
}

//! JPEG decoded a few rows at a time, so that resizing can consume each
//! batch of rows while it is still in cache and the decoded image is never
//! materialised whole (see `crate::resize::stream`).
//!
//! The rows come from libjpeg's scanline API through a small C shim
//! (`jpeg_rows.c`, built by `build.rs` against the same libjpeg-turbo the
//! whole-image path uses), configured as that path configures TurboJPEG:
//! RGB output, ISLOW IDCT, fancy upsampling, warnings are errors. The
//! pixels are therefore the whole-image decoder's exactly (tested in
//! `tests/streamed.rs`).
//!
//! Only the plain case streams: a single-scan JPEG of 1 or 3 components
//! without EXIF rotation. [`RowDecoder::open`] returns `Ok(None)` for
//! everything else (progressive and multi-scan files, CMYK/YCCK, rotated
//! images), and the caller decodes the whole image instead.

use std::ffi::{c_char, c_int, c_uint, c_ulong, CStr};

use super::jpeg::{exif_block, TurboJpeg};
use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat};
use crate::error::VisionError;

const NAME: &str = "JPEG";

/// Most rows one [`RowDecoder::read`] call returns (the shim's bound).
pub(crate) const MAX_BATCH_ROWS: usize = 16;

/// Columns decoded beyond a crop's on either side (two of the widest
/// iMCU), so that no kept pixel sits at libjpeg's cut.
const CROP_MARGIN: usize = 32;

/// A crop starts and (unless it reaches the right edge) spans a multiple
/// of this many columns: a multiple of every iMCU width (8, 16 or 32), so
/// libjpeg keeps the cut where it is asked. Rows of such a width also
/// filter faster: LLaVA-1.5's 1080p crop measured 7.2–7.3 ms per image
/// against 8.1–8.4 with the crop's own odd width (the horizontal pass's
/// loads of the batch stalled).
const CROP_ALIGN: usize = 64;

#[repr(C)]
struct Shim {
    _opaque: [u8; 0],
}

extern "C" {
    fn iris_jpeg_rows_new() -> *mut Shim;
    fn iris_jpeg_rows_free(shim: *mut Shim);
    fn iris_jpeg_rows_message(shim: *const Shim) -> *const c_char;
    fn iris_jpeg_rows_start(
        shim: *mut Shim,
        data: *const u8,
        len: c_ulong,
        width: *mut c_uint,
        height: *mut c_uint,
    ) -> c_int;
    fn iris_jpeg_rows_read(shim: *mut Shim, dst: *mut u8, pitch: c_ulong, max_rows: c_int)
        -> c_int;
    fn iris_jpeg_rows_finish(shim: *mut Shim) -> c_int;
    fn iris_jpeg_rows_crop(shim: *mut Shim, xoffset: *mut c_uint, width: *mut c_uint) -> c_int;
}

/// A started row-by-row decode of one JPEG; the source bytes are borrowed
/// for the decoder's lifetime.
pub(crate) struct RowDecoder<'a> {
    shim: *mut Shim,
    width: usize,
    height: usize,
    /// Rows handed out so far.
    row: usize,
    _bytes: std::marker::PhantomData<&'a [u8]>,
}

// SAFETY: a RowDecoder owns its libjpeg state alone (no other handle to
// the shim exists, and libjpeg keeps no per-thread state), so it may be
// moved to another thread; it is not Sync, so one thread uses it at a time.
unsafe impl Send for RowDecoder<'_> {}

impl Drop for RowDecoder<'_> {
    fn drop(&mut self) {
        // SAFETY: the shim came from iris_jpeg_rows_new and is freed once.
        unsafe { iris_jpeg_rows_free(self.shim) }
    }
}

impl<'a> RowDecoder<'a> {
    /// Starts decoding `bytes` (already sniffed as JPEG) row by row, after
    /// the checks the whole-image path makes (header, 8-bit samples,
    /// `limits`). `Ok(None)`: this file is not streamed (see the module
    /// docs); decode it whole.
    pub(crate) fn open(
        bytes: &'a [u8],
        limits: &DecodeLimits,
    ) -> Result<Option<RowDecoder<'a>>, VisionError> {
        let header = TurboJpeg::decompressor()?.header(bytes)?;
        limits.check(ImageFormat::Jpeg, header.width as u64, header.height as u64)?;
        let rotated = exif_block(bytes)
            .map(Orientation::from_exif_block)
            .is_some_and(|o| o != Orientation::Normal);
        if header.four_components || rotated {
            return Ok(None);
        }
        // SAFETY: plain constructor; a null return is handled below.
        let shim = unsafe { iris_jpeg_rows_new() };
        if shim.is_null() {
            return Err(VisionError::decode(NAME, "cannot create a libjpeg decoder"));
        }
        let mut decoder = RowDecoder {
            shim,
            width: 0,
            height: 0,
            row: 0,
            _bytes: std::marker::PhantomData,
        };
        let (mut w, mut h): (c_uint, c_uint) = (0, 0);
        // SAFETY: valid shim; `bytes` outlives the decoder (lifetime 'a),
        // and the out-pointers are valid for the call.
        let rc = unsafe {
            iris_jpeg_rows_start(shim, bytes.as_ptr(), bytes.len() as c_ulong, &mut w, &mut h)
        };
        match rc {
            1 => {}
            0 => return Ok(None),
            _ => return Err(decoder.error()),
        }
        (decoder.width, decoder.height) = (w as usize, h as usize);
        if (decoder.width, decoder.height) != (header.width, header.height) {
            return Err(VisionError::decode(
                NAME,
                "frame size changed while decoding",
            ));
        }
        Ok(Some(decoder))
    }

    /// Image width in pixels.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Image height in pixels.
    pub(crate) fn height(&self) -> usize {
        self.height
    }

    /// Decodes only the columns `columns` from now on, widened by libjpeg
    /// to whole iMCU columns (a margin on either side keeps the pixels
    /// next to the cut out of the range: they are the whole image's
    /// there); returns the first column decoded. Rows are then
    /// [`Self::width`] pixels wide. Only before the first row.
    pub(crate) fn crop_columns(
        &mut self,
        columns: std::ops::Range<usize>,
    ) -> Result<usize, VisionError> {
        if self.row != 0 || columns.is_empty() || columns.end > self.width {
            return Err(VisionError::decode(
                NAME,
                format!(
                    "cannot crop columns {columns:?} of {} after {} rows",
                    self.width, self.row
                ),
            ));
        }
        let start = columns.start.saturating_sub(CROP_MARGIN) / CROP_ALIGN * CROP_ALIGN;
        let span = (columns.end + CROP_MARGIN - start).div_ceil(CROP_ALIGN) * CROP_ALIGN;
        let end = (start + span).min(self.width);
        let (mut x, mut w) = (start as c_uint, (end - start) as c_uint);
        // SAFETY: valid shim, started, no row read yet; the out-pointers
        // are valid for the call.
        if unsafe { iris_jpeg_rows_crop(self.shim, &mut x, &mut w) } != 0 {
            return Err(self.error());
        }
        let (x, w) = (x as usize, w as usize);
        if x > columns.start || x + w < columns.end || x + w > self.width {
            return Err(VisionError::decode(
                NAME,
                "libjpeg cropped the wrong columns",
            ));
        }
        self.width = w;
        Ok(x)
    }

    /// Rows not yet read.
    pub(crate) fn rows_left(&self) -> usize {
        self.height - self.row
    }

    /// Decodes the next rows into `dst` (whole RGB rows of [`Self::width`]
    /// pixels, at most [`MAX_BATCH_ROWS`] of them used); returns how many
    /// were written, at least one while rows are left. After the last row,
    /// checks the rest of the stream up to its end and returns 0.
    pub(crate) fn read(&mut self, dst: &mut [u8]) -> Result<usize, VisionError> {
        let pitch = self.width * 3;
        if self.rows_left() == 0 {
            // SAFETY: valid shim; every row has been read.
            if unsafe { iris_jpeg_rows_finish(self.shim) } != 0 {
                return Err(self.error());
            }
            return Ok(0);
        }
        let rows = (dst.len() / pitch)
            .min(MAX_BATCH_ROWS)
            .min(self.rows_left());
        if rows == 0 {
            return Err(VisionError::decode(NAME, "row buffer too small"));
        }
        // SAFETY: valid shim; `dst` holds at least `rows` rows of `pitch`
        // bytes, and the shim writes at most `rows` rows of `width` RGB
        // pixels (libjpeg never returns more than the image has).
        let got = unsafe {
            iris_jpeg_rows_read(self.shim, dst.as_mut_ptr(), pitch as c_ulong, rows as c_int)
        };
        if got < 0 {
            return Err(self.error());
        }
        if got == 0 {
            return Err(VisionError::decode(NAME, "decoder returned no rows"));
        }
        self.row += got as usize;
        Ok(got as usize)
    }

    /// The last libjpeg error, as a typed decode error.
    fn error(&self) -> VisionError {
        // SAFETY: the shim's message is a NUL-terminated buffer it owns,
        // valid until the next call on it.
        let message = unsafe { CStr::from_ptr(iris_jpeg_rows_message(self.shim)) };
        VisionError::decode(NAME, message.to_string_lossy().trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode;

    fn file(name: &str) -> Vec<u8> {
        let path = match name.strip_prefix("shared/") {
            Some(file) => iris_testkit::images::shared(file),
            None => format!("{}/tests/data/synthetic/{name}", env!("CARGO_MANIFEST_DIR")).into(),
        };
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every row of `bytes` decoded with only `columns` kept: the rows
    /// and the first column kept.
    fn cropped(bytes: &[u8], columns: std::ops::Range<usize>) -> (Vec<u8>, usize, usize) {
        let limits = DecodeLimits::default();
        let mut rows = RowDecoder::open(bytes, &limits)
            .expect("open")
            .expect("streams");
        let first = rows.crop_columns(columns).expect("crop");
        let width = rows.width();
        let mut out = vec![0u8; width * 3 * rows.height()];
        let mut at = 0;
        loop {
            let got = rows.read(&mut out[at..]).expect("read");
            if got == 0 {
                break;
            }
            at += got * width * 3;
        }
        assert_eq!(at, out.len());
        (out, first, width)
    }

    #[test]
    fn cropped_columns_are_the_whole_decodes_columns() {
        let cases = [
            ("q420_35x29.jpg", 3..20),
            ("q422_41x19.jpg", 17..41),
            ("q444_37x23.jpg", 0..9),
            ("q420_restart_rows.jpg", 5..6),
            ("grey.jpg", 2..7),
            ("shared/motorcycle_1080p.jpg", 419..1501),
            ("shared/coffee.jpg", 100..300),
        ];
        for (name, columns) in cases {
            let bytes = file(name);
            let whole = decode(&bytes, &DecodeLimits::default()).expect("decode");
            let (w, h) = (whole.width() as usize, whole.height() as usize);
            let columns = columns.start.min(w - 1)..columns.end.min(w);
            let (rows, first, width) = cropped(&bytes, columns.clone());
            assert!(
                first <= columns.start && first + width >= columns.end,
                "{name}"
            );
            for y in 0..h {
                let expected =
                    &whole.as_raw()[(y * w + columns.start) * 3..(y * w + columns.end) * 3];
                let got = &rows[(y * width + columns.start - first) * 3..][..columns.len() * 3];
                assert_eq!(got, expected, "{name}: row {y}, columns {columns:?}");
            }
            if name.starts_with("shared/motorcycle") {
                assert!(width < w * 2 / 3, "{name}: {width} of {w} columns decoded");
            }
        }
    }

    #[test]
    fn a_crop_is_refused_after_the_first_row_or_outside_the_image() {
        let bytes = file("q420_35x29.jpg");
        let limits = DecodeLimits::default();
        let mut rows = RowDecoder::open(&bytes, &limits)
            .expect("open")
            .expect("streams");
        assert!(rows.crop_columns(30..40).is_err());
        assert!(rows.crop_columns(5..5).is_err());
        let mut buf = vec![0u8; 35 * 3 * MAX_BATCH_ROWS];
        rows.read(&mut buf).expect("read");
        assert!(rows.crop_columns(0..10).is_err());
    }
}

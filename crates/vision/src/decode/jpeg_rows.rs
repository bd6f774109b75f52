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

use super::jpeg::{exif_block, Header, TurboJpeg};
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

/// Who decodes the Huffman-coded data of a sequential file, and who
/// upsamples and converts its colours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Entropy {
    /// `jpeg_huffman.c` (the same coefficients, faster), and for 4:2:0
    /// YCbCr files on AVX-512 VBMI CPUs `jpeg_color.c`, which upsamples
    /// and converts libjpeg's raw output in one pass (the same bytes as
    /// libjpeg's two passes). The default.
    Iris,
    /// libjpeg's own decoder (tests compare against it).
    #[cfg_attr(not(test), allow(dead_code))]
    Libjpeg,
    /// libjpeg's own, going on past its warning about bytes the data does
    /// not use (tests: the pixels it gives then are Iris's).
    #[cfg(test)]
    LibjpegPastExtraneous,
}

impl Entropy {
    /// `iris_jpeg_rows_start`'s flags (`IRIS_ROWS_*` in the shim).
    fn flags(self) -> c_int {
        match self {
            // Raw data through jpeg_color.c only where its AVX-512 runs.
            Entropy::Iris => 1 | if crate::byte_lookup::vbmi() { 4 } else { 0 },
            Entropy::Libjpeg => 0,
            #[cfg(test)]
            Entropy::LibjpegPastExtraneous => 2,
        }
    }
}

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
        flags: c_int,
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
        Self::open_with(bytes, limits, Entropy::Iris)
    }

    /// [`Self::open`], with the entropy decoding done by `entropy`.
    fn open_with(
        bytes: &'a [u8],
        limits: &DecodeLimits,
        entropy: Entropy,
    ) -> Result<Option<RowDecoder<'a>>, VisionError> {
        let header = TurboJpeg::decompressor()?.header(bytes)?;
        limits.check(ImageFormat::Jpeg, header.width as u64, header.height as u64)?;
        let rotated = exif_block(bytes)
            .map(Orientation::from_exif_block)
            .is_some_and(|o| o != Orientation::Normal);
        if rotated {
            return Ok(None);
        }
        Self::start(bytes, &header, entropy)
    }

    /// Starts decoding `bytes`, whose `header` has been read and checked,
    /// whatever its EXIF orientation (the rows come unrotated).
    /// `Ok(None)`: not a file this decoder takes (see the module docs).
    pub(super) fn start(
        bytes: &'a [u8],
        header: &Header,
        entropy: Entropy,
    ) -> Result<Option<RowDecoder<'a>>, VisionError> {
        if header.four_components {
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
            iris_jpeg_rows_start(
                shim,
                bytes.as_ptr(),
                bytes.len() as c_ulong,
                entropy.flags(),
                &mut w,
                &mut h,
            )
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

    /// Every row, into `out` (exactly [`Self::width`] × [`Self::height`]
    /// RGB pixels), then the rest of the stream checked.
    pub(super) fn read_all(mut self, out: &mut [u8]) -> Result<(), VisionError> {
        if out.len() != self.width * self.height * 3 {
            return Err(VisionError::decode(NAME, "output buffer of the wrong size"));
        }
        let mut at = 0;
        loop {
            match self.read(&mut out[at..])? {
                0 => return Ok(()),
                got => at += got * self.width * 3,
            }
        }
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

    /// All rows of `bytes` through [`RowDecoder`] with `entropy`: the
    /// pixels, or the error's text. `None`: the file does not stream.
    fn rows_with(bytes: &[u8], entropy: Entropy) -> Option<Result<Vec<u8>, String>> {
        let rows = match RowDecoder::open_with(bytes, &DecodeLimits::default(), entropy) {
            Ok(Some(rows)) => rows,
            Ok(None) => return None,
            Err(e) => return Some(Err(e.to_string())),
        };
        let mut out = vec![0u8; rows.width() * 3 * rows.height()];
        Some(
            rows.read_all(&mut out)
                .map(|()| out)
                .map_err(|e| e.to_string()),
        )
    }

    /// Where the entropy-coded data of `bytes` starts (after SOS) and ends
    /// (the EOI marker).
    fn scan_span(bytes: &[u8]) -> std::ops::Range<usize> {
        let sos = bytes
            .windows(2)
            .position(|w| w == [0xFF, 0xDA])
            .expect("SOS");
        let len = usize::from(bytes[sos + 2]) << 8 | usize::from(bytes[sos + 3]);
        let eoi = bytes.len() - 2;
        assert_eq!(&bytes[eoi..], &[0xFF, 0xD9]);
        sos + 2 + len..eoi
    }

    const SEQUENTIAL: [&str; 8] = [
        "baseline.jpg",
        "q420_1x1.jpg",
        "q420_35x29.jpg",
        "q422_41x19.jpg",
        "q444_37x23.jpg",
        "q420_restart_rows.jpg",
        "q444_restart_blocks.jpg",
        "grey.jpg",
    ];

    #[test]
    fn iris_huffman_decoding_gives_libjpegs_pixels() {
        let names = SEQUENTIAL.iter().map(|n| n.to_string()).chain(
            [
                "astronaut.jpg",
                "coffee.jpg",
                "hubble_deep_field.jpg",
                "motorcycle_1080p.jpg",
            ]
            .map(|n| format!("shared/{n}")),
        );
        for name in names.chain(["rgb_keep_rgb.jpg".to_string()]) {
            let bytes = file(&name);
            let ours = rows_with(&bytes, Entropy::Iris).expect("streams");
            let theirs = rows_with(&bytes, Entropy::Libjpeg).expect("streams");
            assert!(ours.is_ok(), "{name}: {ours:?}");
            assert!(ours == theirs, "{name}: pixels differ");
        }
    }

    /// A decode's outcome without its pixels, for messages.
    fn outcome(result: &Option<Result<Vec<u8>, String>>) -> Option<Result<usize, &str>> {
        result
            .as_ref()
            .map(|r| r.as_ref().map(Vec::len).map_err(String::as_str))
    }

    /// Damaged files (cut, flipped, a stray marker, the data replaced by
    /// noise): every outcome libjpeg's decoder has, this one has too (the
    /// same pixels, or an error), but for one documented case:
    /// bytes the data does not use before a marker are passed over, where
    /// libjpeg warns about those beyond its read-ahead.
    #[test]
    fn iris_huffman_decoding_fails_where_libjpeg_does() {
        let mut cases = 0;
        for name in SEQUENTIAL {
            let clean = file(name);
            let scan = scan_span(&clean);
            let step = (scan.len() / 40).max(1);
            let mut damaged = Vec::new();
            for at in (scan.start..scan.end).step_by(step) {
                // Cut short, with and without an EOI marker after the cut.
                damaged.push(("cut", clean[..at].to_vec()));
                damaged.push(("cut+EOI", [&clean[..at], &[0xFF, 0xD9][..]].concat()));
                // Bits flipped.
                for flip in [0x01u8, 0x10, 0x80] {
                    let mut bytes = clean.clone();
                    bytes[at] ^= flip;
                    damaged.push(("flip", bytes));
                }
                // A stray marker inside the data.
                let mut bytes = clean.clone();
                bytes.splice(at..at, [0xFF, 0xC4]);
                damaged.push(("marker", bytes));
            }
            // The data replaced by noise (no 0xFF, so it runs to EOI):
            // bad codes, runs past the block, values of every size.
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            for _ in 0..40 {
                let noise = (scan.start..scan.end).map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((seed >> 33) % 255) as u8
                });
                let bytes: Vec<u8> = clean[..scan.start]
                    .iter()
                    .copied()
                    .chain(noise)
                    .chain(clean[scan.end..].iter().copied())
                    .collect();
                damaged.push(("noise", bytes));
            }
            for (kind, bytes) in damaged {
                let ours = rows_with(&bytes, Entropy::Iris);
                let theirs = rows_with(&bytes, Entropy::Libjpeg);
                cases += 1;
                match (&ours, &theirs) {
                    (Some(Ok(a)), Some(Ok(b))) => assert!(a == b, "{name} {kind}: pixels differ"),
                    (Some(Err(_)), Some(Err(_))) | (None, None) => {}
                    (Some(Ok(a)), Some(Err(e))) if e.contains("extraneous bytes") => {
                        let past = rows_with(&bytes, Entropy::LibjpegPastExtraneous);
                        assert!(
                            matches!(&past, Some(Ok(b)) if a == b),
                            "{name} {kind}: libjpeg past its warning: {:?}",
                            outcome(&past)
                        );
                    }
                    _ => panic!(
                        "{name} {kind}: ours {:?}, libjpeg {:?}",
                        outcome(&ours),
                        outcome(&theirs)
                    ),
                }
            }
        }
        assert!(cases > 1000, "{cases} damaged files");
    }

    /// `junk` inserted at `at` of `name`, decoded by both decoders: ours
    /// gives the clean file's pixels; libjpeg gives them too or warns
    /// about extraneous bytes, and gives them when it goes on past that.
    fn junk_is_passed_over(name: &str, at: usize, junk: &[u8]) {
        let clean = file(name);
        let expected = rows_with(&clean, Entropy::Iris)
            .expect("streams")
            .expect("clean");
        let bytes = [&clean[..at], junk, &clean[at..]].concat();
        let ours = rows_with(&bytes, Entropy::Iris).expect("streams");
        assert!(
            ours.as_ref().ok() == Some(&expected),
            "{name}: {:?}",
            outcome(&Some(ours))
        );
        match rows_with(&bytes, Entropy::Libjpeg).expect("streams") {
            Ok(pixels) => assert!(pixels == expected, "{name}: libjpeg's pixels"),
            Err(e) => assert!(e.contains("extraneous bytes"), "{name}: {e}"),
        }
        let past = rows_with(&bytes, Entropy::LibjpegPastExtraneous).expect("streams");
        assert!(
            past.ok() == Some(expected),
            "{name}: libjpeg past its warning"
        );
    }

    #[test]
    fn bytes_the_data_does_not_use_are_passed_over() {
        let junks: [&[u8]; 3] = [&[0x00], &[0x12, 0x34], &[0x5A; 12]];
        for junk in junks {
            // Before EOI.
            let end = scan_span(&file("q420_35x29.jpg")).end;
            junk_is_passed_over("q420_35x29.jpg", end, junk);
            // Before a restart marker.
            let clean = file("q420_restart_rows.jpg");
            let scan = scan_span(&clean);
            let rst = scan.start
                + clean[scan]
                    .windows(2)
                    .position(|w| w[0] == 0xFF && (0xD0..=0xD7).contains(&w[1]))
                    .expect("a restart marker");
            junk_is_passed_over("q420_restart_rows.jpg", rst, junk);
        }
    }

    extern "C" {
        fn iris_jpeg_rows_is_raw(shim: *const Shim) -> c_int;
        fn iris_color_row(
            y: *const u8,
            cb_sums: *const i16,
            cr_sums: *const i16,
            out: *mut u8,
            width: c_int,
        );
    }

    /// libjpeg's YCbCr -> RGB of one pixel (jdcolor.c's tables, written
    /// out).
    fn libjpeg_rgb(y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let (y, xb, xr) = (i32::from(y), i32::from(cb) - 128, i32::from(cr) - 128);
        let clamp = |v: i32| v.clamp(0, 255) as u8;
        [
            clamp(y + ((91_881 * xr + 32_768) >> 16)),
            clamp(y + ((-22_554 * xb - 46_802 * xr + 32_768) >> 16)),
            clamp(y + ((116_130 * xb + 32_768) >> 16)),
        ]
    }

    /// jpeg_color.c's conversion on every (Y, Cb, Cr): rows of 263 pixels
    /// (four 64-pixel steps, then the one-pixel tail) of constant chroma
    /// (column sums of 4 c upsample to c exactly).
    #[test]
    fn own_colour_conversion_is_libjpegs_on_every_input() {
        if !crate::byte_lookup::vbmi() {
            // The decoder never uses it on this CPU (checked below).
            assert!(!raw_used(&file("shared/motorcycle_1080p.jpg")));
            return;
        }
        const WIDTH: usize = 263;
        let y: Vec<u8> = (0..WIDTH).map(|x| (x * 7 % 256) as u8).collect();
        let mut out = vec![0u8; WIDTH * 3];
        for cb in 0..=255u8 {
            for cr in 0..=255u8 {
                // Sums for WIDTH.div_ceil(2) chroma columns, their two
                // edges and the vector read past the last.
                let sums = |c: u8| vec![4 * i16::from(c); WIDTH.div_ceil(2) + 2 + 32];
                let (cb_sums, cr_sums) = (sums(cb), sums(cr));
                // SAFETY: rows of WIDTH pixels (and the sums' padding the
                // C side reads), all live for the call; the CPU has the
                // instructions (checked above).
                unsafe {
                    iris_color_row(
                        y.as_ptr(),
                        cb_sums.as_ptr(),
                        cr_sums.as_ptr(),
                        out.as_mut_ptr(),
                        WIDTH as c_int,
                    )
                };
                for (x, px) in out.chunks_exact(3).enumerate() {
                    assert_eq!(px, libjpeg_rgb(y[x], cb, cr), "Y {} Cb {cb} Cr {cr}", y[x]);
                }
            }
        }
    }

    /// Whether `bytes` decodes through raw data and jpeg_color.c.
    fn raw_used(bytes: &[u8]) -> bool {
        let rows = RowDecoder::open(bytes, &DecodeLimits::default())
            .expect("open")
            .expect("streams");
        // SAFETY: a started shim.
        unsafe { iris_jpeg_rows_is_raw(rows.shim) != 0 }
    }

    /// 4:2:0 files of every size around the 64-pixel steps and the
    /// iMCU rows, through raw data and jpeg_color.c: libjpeg's pixels.
    #[test]
    fn own_upsampling_and_conversion_give_libjpegs_pixels() {
        let available = crate::byte_lookup::vbmi();
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for width in [5usize, 6, 7, 33, 63, 64, 65, 127, 128, 129, 130, 257] {
            for height in [1usize, 2, 3, 15, 16, 17, 31, 33] {
                // Gradients with noise: every chroma value changes.
                let rgb: Vec<u8> = (0..width * height * 3)
                    .map(|i| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        ((i * 37 / 3 + (seed % 64) as usize) % 256) as u8
                    })
                    .collect();
                let bytes =
                    super::super::jpeg::encode_rgb(&rgb, width, height, 90).expect("encode");
                assert_eq!(raw_used(&bytes), available, "{width}x{height}");
                let ours = rows_with(&bytes, Entropy::Iris).expect("streams");
                let theirs = rows_with(&bytes, Entropy::Libjpeg).expect("streams");
                assert!(ours.is_ok(), "{width}x{height}: {ours:?}");
                assert!(ours == theirs, "{width}x{height}: pixels differ");
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

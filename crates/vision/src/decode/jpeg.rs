//! JPEG through libjpeg-turbo, the library Pillow decodes with, so decoded
//! pixels are Pillow's exactly: ISLOW integer IDCT, fancy upsampling and
//! libjpeg's YCbCr→RGB tables, as `PIL.Image.open(...).convert("RGB")` does.
//!
//! libjpeg-turbo is built from the source vendored in `turbojpeg-sys` (see
//! docs/vision.md for the version). Sequential files are decoded through
//! its scanline API ([`super::jpeg_rows`], with Iris's own Huffman
//! decoding: the same coefficients, faster), everything else through its
//! TurboJPEG 3 API. Both catch libjpeg's errors with `setjmp` inside C and
//! return them, so a corrupt file never aborts the process. Warnings (a
//! truncated stream, corrupt entropy data) are turned into errors
//! (`TJPARAM_STOPONWARNING`): Pillow refuses truncated JPEGs too.
//!
//! Four-component JPEGs (CMYK and YCCK, which libjpeg turns into CMYK) are
//! read as Pillow reads them: raw mode `CMYK;I`, i.e. every sample inverted,
//! whatever the Adobe APP14 segment says, then Pillow's CMYK→RGB formula.
//! EXIF orientation comes from the first `Exif` APP1 segment before the first
//! scan, as Pillow takes it.

use std::ffi::{c_int, CStr};

use turbojpeg_sys as tj;

use super::convert::{to_rgb, Layout};
use super::jpeg_rows::{Entropy, RowDecoder};
use super::orientation::Orientation;
use super::{DecodeLimits, ImageFormat, ImageInfo};
use crate::error::VisionError;
use crate::scratch::ensure_len;

const NAME: &str = "JPEG";

/// Most progressive scans accepted (libjpeg-turbo's own `TJFLAG_LIMITSCANS`
/// value): a crafted file with thousands of tiny scans would otherwise cost
/// a full-image pass each.
const SCAN_LIMIT: c_int = 500;

/// What the frame header says.
pub(super) struct Header {
    pub(super) width: usize,
    pub(super) height: usize,
    /// CMYK or YCCK: decoded as CMYK, then converted as Pillow does.
    pub(super) four_components: bool,
}

/// A TurboJPEG instance, destroyed on drop: a decompressor for the images
/// requests bring, or a compressor ([`encode_rgb`]).
pub(super) struct TurboJpeg(tj::tjhandle);

impl Drop for TurboJpeg {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

impl TurboJpeg {
    fn init(kind: tj::TJINIT) -> Result<Self, VisionError> {
        // SAFETY: plain constructor; a null return is handled below.
        let handle = unsafe { tj::tj3Init(kind as c_int) };
        if handle.is_null() {
            return Err(VisionError::decode(
                NAME,
                "cannot create a libjpeg-turbo instance",
            ));
        }
        Ok(TurboJpeg(handle))
    }

    /// A decompressor that refuses truncated or corrupt data and caps the
    /// progressive scans.
    pub(super) fn decompressor() -> Result<Self, VisionError> {
        let this = Self::init(tj::TJINIT_TJINIT_DECOMPRESS)?;
        this.set(tj::TJPARAM_TJPARAM_STOPONWARNING, 1)?;
        this.set(tj::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT)?;
        Ok(this)
    }

    fn set(&self, param: tj::TJPARAM, value: c_int) -> Result<(), VisionError> {
        // SAFETY: valid handle; TurboJPEG validates the parameter.
        if unsafe { tj::tj3Set(self.0, param as c_int, value) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }

    fn get(&self, param: tj::TJPARAM) -> c_int {
        // SAFETY: valid handle; unknown parameters return -1.
        unsafe { tj::tj3Get(self.0, param as c_int) }
    }

    /// The last error, as a typed decode error.
    fn error(&self) -> VisionError {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by
        // the instance (or a static one), valid until the next call on it.
        let message = unsafe {
            let ptr = tj::tj3GetErrorStr(self.0);
            if ptr.is_null() {
                String::from("unknown libjpeg-turbo error")
            } else {
                CStr::from_ptr(ptr).to_string_lossy().into_owned()
            }
        };
        VisionError::decode(NAME, message.trim_end())
    }

    /// Reads the headers up to the first scan; allocates no pixel memory.
    pub(super) fn header(&self, bytes: &[u8]) -> Result<Header, VisionError> {
        // SAFETY: valid handle; the buffer outlives the call.
        let rc =
            unsafe { tj::tj3DecompressHeader(self.0, bytes.as_ptr(), bytes.len() as tj::size_t) };
        if rc != 0 {
            return Err(self.error());
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width < 1 || height < 1 {
            // A tables-only datastream: no frame at all.
            return Err(VisionError::decode(NAME, "no frame header"));
        }
        let precision = self.get(tj::TJPARAM_TJPARAM_PRECISION);
        if precision != 8 {
            return Err(VisionError::decode(
                NAME,
                format!("{precision}-bit samples are not supported (Pillow reads 8-bit JPEG only)"),
            ));
        }
        let colorspace = self.get(tj::TJPARAM_TJPARAM_COLORSPACE);
        let four_components = match colorspace as tj::TJCS {
            tj::TJCS_TJCS_RGB | tj::TJCS_TJCS_YCbCr | tj::TJCS_TJCS_GRAY => false,
            tj::TJCS_TJCS_CMYK | tj::TJCS_TJCS_YCCK => true,
            _ => return Err(VisionError::decode(NAME, "unknown colour space")),
        };
        Ok(Header {
            width: width as usize,
            height: height as usize,
            four_components,
        })
    }

    /// Decodes the whole image into `dst` (`height` rows of `width` pixels
    /// of `format`, tightly packed), which the caller sized from the header.
    fn decompress(
        &self,
        bytes: &[u8],
        dst: &mut [u8],
        header: &Header,
        format: tj::TJPF,
    ) -> Result<(), VisionError> {
        let bpp = if format == tj::TJPF_TJPF_CMYK { 4 } else { 3 };
        let pitch = header.width * bpp;
        if dst.len() != pitch * header.height {
            return Err(VisionError::decode(
                NAME,
                "output buffer does not fit the frame",
            ));
        }
        let pitch =
            c_int::try_from(pitch).map_err(|_| VisionError::decode(NAME, "row too long"))?;
        // Decoding re-reads the same headers from the same bytes, so the
        // frame is the one `dst` was sized for; as a second guard, a larger
        // frame would be refused before any row is written.
        if let Ok(pixels) = c_int::try_from(header.width * header.height) {
            self.set(tj::TJPARAM_TJPARAM_MAXPIXELS, pixels)?;
        }
        // SAFETY: valid handle; `dst` holds `height` rows of `pitch` bytes,
        // exactly what the frame decodes to, and outlives the call.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.0,
                bytes.as_ptr(),
                bytes.len() as tj::size_t,
                dst.as_mut_ptr(),
                pitch,
                format,
            )
        };
        if rc != 0 {
            return Err(self.error());
        }
        Ok(())
    }
}

/// Size and decoding memory from the headers. libjpeg's own whole-image
/// coefficient buffer (2 bytes per sample per component) is needed by
/// progressive and multi-scan files only, but is counted for every JPEG:
/// which kind a file is shows only in its scans. Then the CMYK samples
/// before conversion, or the copy EXIF orientation makes.
pub(super) fn probe(bytes: &[u8]) -> Result<ImageInfo, VisionError> {
    let header = TurboJpeg::decompressor()?.header(bytes)?;
    let orientation = exif_block(bytes)
        .map(Orientation::from_exif_block)
        .unwrap_or_default();
    let oriented = orientation != Orientation::Normal;
    let (components, raw) = match (header.four_components, oriented) {
        (true, _) => (4, 4),
        (false, true) => (3, 3),
        (false, false) => (3, 0),
    };
    Ok(ImageInfo {
        format: ImageFormat::Jpeg,
        width: u32::try_from(header.width).unwrap_or(u32::MAX),
        height: u32::try_from(header.height).unwrap_or(u32::MAX),
        work_bytes_per_pixel: 2 * components + raw,
        swaps_axes: orientation.swaps_axes(),
    })
}

/// Decodes to RGB8 in `out`; returns size and EXIF orientation.
pub(super) fn decode(
    bytes: &[u8],
    limits: &DecodeLimits,
    out: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize, Orientation), VisionError> {
    let decompressor = TurboJpeg::decompressor()?;
    let header = decompressor.header(bytes)?;
    let (w, h) = (header.width, header.height);
    limits.check(ImageFormat::Jpeg, w as u64, h as u64)?;
    let orientation = exif_block(bytes)
        .map(Orientation::from_exif_block)
        .unwrap_or_default();
    if header.four_components {
        ensure_len(raw, w * h * 4);
        decompressor.decompress(bytes, raw, &header, tj::TJPF_TJPF_CMYK)?;
        // Pillow's `CMYK;I`: every sample inverted.
        raw.iter_mut().for_each(|v| *v = !*v);
        ensure_len(out, w * h * 3);
        to_rgb(Layout::Cmyk8, raw, out);
    } else {
        // Greyscale is expanded by libjpeg (each grey value replicated),
        // exactly as Pillow's `convert("RGB")` of an `L` image. Sequential
        // files go through the row decoder for its faster Huffman decoding
        // (the same pixels); progressive ones through TurboJPEG.
        ensure_len(out, w * h * 3);
        match RowDecoder::start(bytes, &header, Entropy::Iris)? {
            Some(rows) => rows.read_all(&mut out[..w * h * 3])?,
            None => decompressor.decompress(bytes, out, &header, tj::TJPF_TJPF_RGB)?,
        }
    }
    Ok((w, h, orientation))
}

/// Encodes `rgb` (`height` tightly packed rows of `width` RGB8 pixels) as
/// a baseline JPEG with 4:2:0 chroma, as cameras and screenshots tools
/// commonly write them.
pub(crate) fn encode_rgb(
    rgb: &[u8],
    width: usize,
    height: usize,
    quality: u8,
) -> Result<Vec<u8>, VisionError> {
    let too_big = || VisionError::decode(NAME, "image too large to encode");
    if rgb.len() != width * height * 3 {
        return Err(VisionError::decode(NAME, "pixels do not fit the size"));
    }
    let (w, h) = (c_int::try_from(width), c_int::try_from(height));
    let (Ok(w), Ok(h)) = (w, h) else {
        return Err(too_big());
    };
    let pitch = c_int::try_from(width * 3).map_err(|_| too_big())?;
    let compressor = TurboJpeg::init(tj::TJINIT_TJINIT_COMPRESS)?;
    compressor.set(tj::TJPARAM_TJPARAM_QUALITY, c_int::from(quality))?;
    compressor.set(tj::TJPARAM_TJPARAM_SUBSAMP, tj::TJSAMP_TJSAMP_420 as c_int)?;
    let mut out: *mut std::ffi::c_uchar = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: valid handle; `rgb` holds `h` rows of `pitch` bytes and
    // outlives the call; TurboJPEG allocates `out`, freed below.
    let rc = unsafe {
        tj::tj3Compress8(
            compressor.0,
            rgb.as_ptr(),
            w,
            pitch,
            h,
            tj::TJPF_TJPF_RGB as c_int,
            &mut out,
            &mut size,
        )
    };
    let encoded = (rc == 0 && !out.is_null()).then(|| {
        // SAFETY: on success `out` holds `size` bytes.
        unsafe { std::slice::from_raw_parts(out, size as usize) }.to_vec()
    });
    // SAFETY: `out` is null or TurboJPEG's own allocation, freed once.
    unsafe { tj::tj3Free(out.cast()) };
    encoded.ok_or_else(|| compressor.error())
}

/// The TIFF data of the first `Exif` APP1 segment before the first scan.
pub(super) fn exif_block(bytes: &[u8]) -> Option<&[u8]> {
    let mut i = 2;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            return None;
        }
        let marker = bytes[i + 1];
        match marker {
            0xFF => i += 1,
            0xD0..=0xD7 | 0x01 => i += 2,
            0xDA | 0xD9 => return None,
            _ => {
                let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
                let segment = bytes.get(i + 4..(i + 2 + len).max(i + 4))?;
                if marker == 0xE1 {
                    if let Some(tiff) = segment.strip_prefix(b"Exif\0\0") {
                        return Some(tiff);
                    }
                }
                i += 2 + len.max(2);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exif_walk_takes_the_first_block_and_stops_at_the_scan() {
        let mut jpeg = vec![0xFF, 0xD8];
        for payload in [&b"Exif\0\0MM\0*first"[..], b"Exif\0\0II*\0second"] {
            jpeg.extend_from_slice(&[0xFF, 0xE1]);
            jpeg.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
            jpeg.extend_from_slice(payload);
        }
        assert_eq!(exif_block(&jpeg), Some(&b"MM\0*first"[..]));
        let mut late = vec![0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02];
        late.extend_from_slice(&jpeg[2..]);
        assert_eq!(exif_block(&late), None);
        // A length running past the end, or below 2, never panics.
        assert_eq!(exif_block(&[0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xFF, 0]), None);
        assert_eq!(
            exif_block(&[0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x00, 0xFF, 0xD9]),
            None
        );
    }
}

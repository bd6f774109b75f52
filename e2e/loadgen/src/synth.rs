//! Synthetic images for `--image-size WxH`, as `vllm bench serve
//! --dataset-name random-mm` makes them: uniformly random RGB pixels from
//! a seeded generator, encoded once per size as a baseline JPEG (quality
//! 75, 4:2:0, Pillow's defaults) with the libjpeg-turbo the vision crate
//! already builds. Distinct images then differ by a JPEG comment
//! (see `image`), so the run pays for the encoding once, not per request.

use anyhow::{bail, Context};

use crate::arrivals::SplitMix64;

/// Largest side of a synthetic image.
pub const MAX_SIDE: u32 = 8192;
/// JPEG quality (Pillow's default).
const QUALITY: i32 = 75;

/// A `WxH[:WEIGHT]` option: the size and its relative weight (default 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeSpec {
    pub width: u32,
    pub height: u32,
    pub weight: f64,
}

impl std::str::FromStr for SizeSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<SizeSpec> {
        let (size, weight) = match s.split_once(':') {
            Some((size, w)) => {
                let weight: f64 = w
                    .trim()
                    .parse()
                    .with_context(|| format!("{s:?}: the weight after ':' is not a number"))?;
                (size, weight)
            }
            None => (s, 1.0),
        };
        let (w, h) = size
            .split_once(['x', 'X'])
            .with_context(|| format!("{s:?}: expected WIDTHxHEIGHT[:WEIGHT], e.g. 1920x1080"))?;
        let side = |v: &str, what: &str| -> anyhow::Result<u32> {
            let n: u32 = v
                .trim()
                .parse()
                .with_context(|| format!("{s:?}: the {what} is not a whole number"))?;
            if n == 0 || n > MAX_SIDE {
                bail!("{s:?}: the {what} must be between 1 and {MAX_SIDE}, not {n}");
            }
            Ok(n)
        };
        if !(weight.is_finite() && weight > 0.0) {
            bail!("{s:?}: the weight must be above 0, not {weight}");
        }
        Ok(SizeSpec {
            width: side(w, "width")?,
            height: side(h, "height")?,
            weight,
        })
    }
}

/// Random RGB pixels (`width · height · 3` bytes) from `seed`.
pub fn noise(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let n = width as usize * height as usize * 3;
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A JPEG of random pixels of this size.
pub fn noise_jpeg(width: u32, height: u32, seed: u64) -> anyhow::Result<Vec<u8>> {
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        bail!("a synthetic image must be 1 to {MAX_SIDE} pixels a side, not {width}x{height}");
    }
    encode_rgb(&noise(width, height, seed), width, height)
        .with_context(|| format!("cannot encode a {width}x{height} JPEG"))
}

/// Encodes packed RGB8 as a baseline JPEG.
#[allow(unsafe_code)]
fn encode_rgb(rgb: &[u8], width: u32, height: u32) -> anyhow::Result<Vec<u8>> {
    use turbojpeg_sys as tj;
    let (w, h) = (width as i32, height as i32);
    if rgb.len() != width as usize * height as usize * 3 {
        bail!("{} bytes for a {width}x{height} RGB image", rgb.len());
    }
    // SAFETY: the handle is checked for null and destroyed on every path;
    // the source buffer holds `pitch · height` bytes (checked above) and
    // outlives the call; libjpeg-turbo allocates the output, which is
    // copied out and freed with tjFree before returning.
    unsafe {
        let handle = tj::tjInitCompress();
        if handle.is_null() {
            bail!("libjpeg-turbo could not start a compressor");
        }
        let mut out: *mut libc::c_uchar = std::ptr::null_mut();
        let mut size: libc::c_ulong = 0;
        let rc = tj::tjCompress2(
            handle,
            rgb.as_ptr(),
            w,
            w * 3,
            h,
            tj::TJPF_TJPF_RGB,
            &mut out,
            &mut size,
            tj::TJSAMP_TJSAMP_420,
            QUALITY,
            0,
        );
        let result = if rc != 0 || out.is_null() {
            let msg = std::ffi::CStr::from_ptr(tj::tjGetErrorStr2(handle))
                .to_string_lossy()
                .into_owned();
            Err(anyhow::anyhow!("libjpeg-turbo: {msg}"))
        } else {
            Ok(std::slice::from_raw_parts(out, size as usize).to_vec())
        };
        if !out.is_null() {
            tj::tjFree(out);
        }
        tj::tjDestroy(handle);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_weights() {
        let s: SizeSpec = "1920x1080".parse().unwrap();
        assert_eq!((s.width, s.height, s.weight), (1920, 1080, 1.0));
        let s: SizeSpec = "256X256:0.25".parse().unwrap();
        assert_eq!((s.width, s.height, s.weight), (256, 256, 0.25));
        for bad in [
            "", "1920", "0x10", "10x0", "9000x10", "axb", "10x10:0", "10x10:-1", "10x10:x",
        ] {
            assert!(bad.parse::<SizeSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn noise_is_seeded() {
        assert_eq!(noise(7, 5, 1).len(), 105);
        assert_eq!(noise(7, 5, 1), noise(7, 5, 1));
        assert_ne!(noise(7, 5, 1), noise(7, 5, 2));
    }

    #[test]
    fn synthetic_jpegs_decode_to_their_size() {
        let jpeg = noise_jpeg(64, 48, 3).unwrap();
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
        assert_eq!(&jpeg[jpeg.len() - 2..], &[0xFF, 0xD9]);
        let limits = iris_vision::DecodeLimits::default();
        let decoded = iris_vision::decode(&jpeg, &limits).unwrap();
        assert_eq!(decoded.dimensions(), (64, 48));
        assert!(noise_jpeg(0, 10, 1).is_err());
    }
}

//! The normalisation tables ([`crate::normalize::Lut`]) applied to 64
//! pixels at a time by AVX-512 VBMI byte permutes, for the planar writer
//! ([`crate::layout::planar_rows`]).
//!
//! A table maps a channel's 8-bit value to its output element: 4 bytes in
//! float32, 2 in bfloat16. Laid out as *byte planes* (plane `b` holds byte
//! `b` of the 256 entries: four 64-byte vectors), a lookup of 64 values is,
//! per plane, two two-vector byte permutes (`vpermi2b` reads the low seven
//! bits of each index: entries 0–127, then 128–255) and a blend on the
//! indices' top bits; byte and word unpacks then put each element's bytes
//! together. The elements are the table's own, so the result is the
//! scalar lookup's bit for bit; the scalar loop does the tails, and CPUs
//! without VBMI.
//!
//! The unpacks interleave within 128-bit lanes, so the first step, which
//! gathers one channel's bytes out of 64 RGB pixels (192 bytes, three
//! vectors), takes the pixels in the order that makes the unpacked
//! elements come out in order.

use bytemuck::Pod;

/// Pixels looked up together.
pub(crate) const GROUP: usize = 64;

/// Three channels' tables as byte planes: channel `c`'s plane `b` is
/// `bytes[(c · width + b) · 256 ..][..256]`.
#[derive(Clone)]
pub(crate) struct BytePlanes {
    /// Bytes per element (2 or 4; other widths are never looked up here).
    width: usize,
    bytes: Vec<u8>,
}

impl BytePlanes {
    /// The planes of `tables` (one 256-entry table per channel).
    pub(crate) fn new<T: Pod>(tables: &[[T; 256]; 3]) -> BytePlanes {
        let width = std::mem::size_of::<T>();
        let mut bytes = vec![0u8; 3 * width * 256];
        for (c, table) in tables.iter().enumerate() {
            let entries: &[u8] = bytemuck::cast_slice(table);
            for (v, element) in entries.chunks_exact(width).enumerate() {
                for (b, &byte) in element.iter().enumerate() {
                    bytes[(c * width + b) * 256 + v] = byte;
                }
            }
        }
        BytePlanes { width, bytes }
    }
}

/// Looks up the pixels of `rgb` (3 bytes each), [`GROUP`] at a time, into
/// `out[c]` (channel `c`'s elements, `width` bytes each, one per pixel).
/// Returns the number of pixels written: a multiple of [`GROUP`], 0 when
/// the CPU lacks AVX-512 VBMI or the elements are not 2 or 4 bytes wide.
pub(crate) fn planar(rgb: &[u8], planes: &BytePlanes, out: [&mut [u8]; 3]) -> usize {
    lookup::<false>(rgb, planes, out)
}

/// [`planar`] with streaming (non-temporal) stores, for `out` in the
/// output tensor itself: 0 (nothing written) unless every `out[c]` starts
/// on a 64-byte boundary. Call [`crate::stream::fence`] after the last.
pub(crate) fn planar_streamed(rgb: &[u8], planes: &BytePlanes, out: [&mut [u8]; 3]) -> usize {
    if out.iter().any(|o| o.as_ptr().align_offset(64) != 0) {
        return 0;
    }
    lookup::<true>(rgb, planes, out)
}

/// [`planar`]'s checks and dispatch; `STREAM` picks the stores.
fn lookup<const STREAM: bool>(rgb: &[u8], planes: &BytePlanes, out: [&mut [u8]; 3]) -> usize {
    let groups = rgb.len() / (3 * GROUP);
    let fits = out.iter().all(|o| o.len() >= groups * GROUP * planes.width);
    if groups == 0 || !fits || !vbmi() {
        return 0;
    }
    // SAFETY: the CPU supports AVX-512 F, BW and VBMI (checked above);
    // `rgb` holds `groups` groups of pixels and every `out[c]` their
    // elements (checked above); with `STREAM`, every `out[c]` starts
    // 64-byte aligned (checked by the caller).
    unsafe {
        match planes.width {
            4 => planar_vbmi::<4, STREAM>(rgb, groups, planes, out),
            2 => planar_vbmi::<2, STREAM>(rgb, groups, planes, out),
            _ => return 0,
        }
    }
    groups * GROUP
}

/// Whether the CPU has AVX-512 F, BW and VBMI (the byte permutes here, in
/// the transposing resize pass and in the JPEG decoder's colour pass,
/// `decode/jpeg_color.c`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vbmi() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn vbmi() -> bool {
    false
}

/// The pixel (of 64) that position `p` of a channel's gathered bytes
/// holds, for elements of `width` bytes: after the unpacks, output vector
/// `k`'s 128-bit lane `l` holds positions `16l + (64/width/4)·k ..`, and
/// those must be pixels `(64/width)·k + (16/width)·l ..`.
const fn pixel_at(width: usize, p: usize) -> usize {
    let (lane, r) = (p / 16, p % 16);
    let run = 16 / width; // positions per output vector per lane
    let (k, j) = (r / run, r % run);
    GROUP / width * k + run * lane + j
}

/// Indices gathering channel `c`'s bytes of 64 RGB pixels in
/// [`pixel_at`]'s order: byte `3·pixel + c` of the 192, read from the first
/// two vectors (index below 128) or, where `mask` is set, from the third
/// (`high`, index minus 128).
struct Gather {
    low: [u8; 64],
    high: [u8; 64],
    mask: u64,
}

const fn gather(width: usize, c: usize) -> Gather {
    let mut g = Gather {
        low: [0; 64],
        high: [0; 64],
        mask: 0,
    };
    let mut p = 0;
    while p < 64 {
        let byte = 3 * pixel_at(width, p) + c;
        if byte < 128 {
            g.low[p] = byte as u8;
        } else {
            g.high[p] = (byte - 128) as u8;
            g.mask |= 1 << p;
        }
        p += 1;
    }
    g
}

const GATHER_4: [Gather; 3] = [gather(4, 0), gather(4, 1), gather(4, 2)];
const GATHER_2: [Gather; 3] = [gather(2, 0), gather(2, 1), gather(2, 2)];

/// [`planar`]'s body for elements of `W` bytes: `groups` groups of
/// pixels of `rgb`, each channel into its `out` entry (slices too short
/// panic); with `STREAM`, by streaming stores into 64-byte aligned `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn planar_vbmi<const W: usize, const STREAM: bool>(
    rgb: &[u8],
    groups: usize,
    planes: &BytePlanes,
    out: [&mut [u8]; 3],
) {
    use std::arch::x86_64::*;
    let gathers = if W == 4 { &GATHER_4 } else { &GATHER_2 };
    let load = |bytes: &[u8]| {
        let bytes = &bytes[..64];
        // SAFETY: `bytes` is 64 readable bytes; AVX-512 F is enabled.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
    };
    for (c, out) in out.into_iter().enumerate() {
        let g = &gathers[c];
        let (low, high, mask) = (load(&g.low), load(&g.high), g.mask);
        // tables[b][h]: byte plane b, entries 64h .. 64h + 63.
        let mut tables = [[_mm512_setzero_si512(); 4]; W];
        for (b, plane) in tables.iter_mut().enumerate() {
            let bytes = &planes.bytes[(c * W + b) * 256..][..256];
            for (h, v) in plane.iter_mut().enumerate() {
                *v = load(&bytes[64 * h..]);
            }
        }
        for group in 0..groups {
            let src = &rgb[group * 3 * GROUP..][..3 * GROUP];
            let (a, b, last) = (load(src), load(&src[64..]), load(&src[128..]));
            let values = _mm512_permutex2var_epi8(a, low, b);
            let values = _mm512_mask_permutexvar_epi8(values, mask, high, last);
            let top = _mm512_movepi8_mask(values);
            let mut bytes = [_mm512_setzero_si512(); W];
            for (plane, t) in bytes.iter_mut().zip(&tables) {
                let below = _mm512_permutex2var_epi8(t[0], values, t[1]);
                let above = _mm512_permutex2var_epi8(t[2], values, t[3]);
                *plane = _mm512_mask_blend_epi8(top, below, above);
            }
            let dst = &mut out[group * GROUP * W..][..GROUP * W];
            let mut store = |k: usize, v: __m512i| {
                let dst = &mut dst[64 * k..][..64];
                // SAFETY: `dst` is 64 writable bytes, 64-byte aligned with
                // `STREAM` (`out` is, and `GROUP · W` is a multiple of 64);
                // AVX-512 F is enabled.
                unsafe {
                    if STREAM {
                        _mm512_stream_si512(dst.as_mut_ptr().cast(), v)
                    } else {
                        _mm512_storeu_si512(dst.as_mut_ptr().cast(), v)
                    }
                }
            };
            if W == 4 {
                let (b0, b1, b2, b3) = (bytes[0], bytes[1], bytes[2 % W], bytes[3 % W]);
                let (w01, w01h) = (_mm512_unpacklo_epi8(b0, b1), _mm512_unpackhi_epi8(b0, b1));
                let (w23, w23h) = (_mm512_unpacklo_epi8(b2, b3), _mm512_unpackhi_epi8(b2, b3));
                store(0, _mm512_unpacklo_epi16(w01, w23));
                store(1, _mm512_unpackhi_epi16(w01, w23));
                store(2, _mm512_unpacklo_epi16(w01h, w23h));
                store(3, _mm512_unpackhi_epi16(w01h, w23h));
            } else {
                store(0, _mm512_unpacklo_epi8(bytes[0], bytes[1 % W]));
                store(1, _mm512_unpackhi_epi8(bytes[0], bytes[1 % W]));
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn planar_vbmi<const W: usize, const STREAM: bool>(
    _rgb: &[u8],
    _groups: usize,
    _planes: &BytePlanes,
    _out: [&mut [u8]; 3],
) {
    unreachable!("VBMI is x86-only")
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::normalize::{Normalization, OutElem};
    use crate::resize::testing::noise;

    /// The scalar lookup of every pixel, planar.
    fn scalar<T: OutElem>(rgb: &[u8], tables: &[[T; 256]; 3]) -> [Vec<T>; 3] {
        std::array::from_fn(|c| {
            rgb.chunks_exact(3)
                .map(|px| tables[c][usize::from(px[c])])
                .collect()
        })
    }

    fn check<T: OutElem>(tables: &[[T; 256]; 3]) {
        let planes = BytePlanes::new(tables);
        for pixels in [0, 1, 63, 64, 65, 128, 200, 4096] {
            let rgb = noise(pixels * 3, pixels as u32 + 1);
            let expected = scalar(&rgb, tables);
            let mut got: [Vec<T>; 3] = std::array::from_fn(|_| vec![T::default(); pixels]);
            let [r, g, b] = &mut got;
            let done = planar(
                &rgb,
                &planes,
                [r, g, b].map(|v| bytemuck::cast_slice_mut::<T, u8>(v.as_mut_slice())),
            );
            let vbmi = vbmi() && matches!(std::mem::size_of::<T>(), 2 | 4);
            assert_eq!(
                done,
                if vbmi { pixels / GROUP * GROUP } else { 0 },
                "{pixels} pixels"
            );
            for c in 0..3 {
                assert!(
                    bytemuck::cast_slice::<T, u8>(&got[c][..done])
                        == bytemuck::cast_slice::<T, u8>(&expected[c][..done]),
                    "{pixels} pixels, channel {c}"
                );
            }
        }
    }

    #[test]
    fn every_entry_and_position_matches_the_scalar_lookup() {
        // Tables whose entries differ from each other in every byte, and
        // from channel to channel: a misplaced byte, pixel or channel
        // shows (the comparison is of bytes, so any bit pattern will do).
        let byte =
            |v: usize, c: usize, k: u8| (v as u8).rotate_left(u32::from(k)) ^ (c as u8 * 37 + k);
        let distinct_f32: [[f32; 256]; 3] = std::array::from_fn(|c| {
            std::array::from_fn(|v| f32::from_le_bytes([0, 1, 2, 3].map(|k| byte(v, c, k))))
        });
        check(&distinct_f32);
        let norm = Normalization::CLIP;
        check(&norm.lut::<f32>().0);
        check(&norm.lut::<bf16>().0);
        let distinct_bf16: [[bf16; 256]; 3] = std::array::from_fn(|c| {
            std::array::from_fn(|v| bf16::from_le_bytes([0, 1].map(|k| byte(v, c, k))))
        });
        check(&distinct_bf16);
    }
}

//! Writing one resized frame into its temporal slot of Qwen patch rows.
//!
//! A temporal group of T frames fills one block of rows ordered
//! (h/M, w/M, m_h, m_w); a row holds (C, T, p_y, p_x), so frame `t` of the
//! group owns the `P·P` runs at `(c·T + t)·P·P` of every row — the layout
//! of transformers' `permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)`.

use crate::image::RgbView;
use crate::layout::PatchGeometry;
use crate::normalize::{Lut, OutElem};

/// Writes `frame` (dimensions multiples of P·M) into slot `slot` of the
/// rows in `group` (exactly one temporal group).
pub(crate) fn write_slot<T: OutElem>(
    frame: RgbView<'_>,
    geo: PatchGeometry,
    lut: &Lut<T>,
    slot: usize,
    group: &mut [T],
) {
    let (p, m, tp) = (geo.patch_size, geo.merge_size, geo.temporal_patch_size);
    let blocks_w = frame.width() / p / m;
    let plane = p * p;
    let data = frame.data();
    for (i, row) in group.chunks_exact_mut(geo.row_len()).enumerate() {
        let (block, mh, mw) = (i / (m * m), (i / m) % m, i % m);
        let (gy, gx) = ((block / blocks_w) * m + mh, (block % blocks_w) * m + mw);
        for py in 0..p {
            let start = ((gy * p + py) * frame.width() + gx * p) * 3;
            let src = &data[start..start + p * 3];
            for (c, table) in lut.0.iter().enumerate() {
                let at = (c * tp + slot) * plane + py * p;
                for (v, px) in row[at..at + p].iter_mut().zip(src.chunks_exact(3)) {
                    *v = table[usize::from(px[c])];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::Normalization;

    /// Element (row, c, t, py, px) per the reference's view + permute,
    /// computed index by index from 5-D coordinates.
    #[test]
    fn slots_follow_the_reference_permutation() {
        let geo = PatchGeometry {
            patch_size: 2,
            merge_size: 2,
            temporal_patch_size: 2,
        };
        let (w, h) = (8, 4);
        let frames: Vec<Vec<u8>> = (0..2)
            .map(|t| (0..w * h * 3).map(|i| (i * 3 + t * 101) as u8).collect())
            .collect();
        let norm = Normalization {
            rescale_factor: 1.0,
            mean: [0.0; 3],
            std: [1.0; 3],
        };
        let lut = norm.fused_lut::<f32>();
        let rows = (h / 2) * (w / 2);
        let mut out = vec![0f32; rows * geo.row_len()];
        for (t, f) in frames.iter().enumerate() {
            write_slot(RgbView::new(f, w, h).unwrap(), geo, &lut, t, &mut out);
        }
        let (gh, gw) = (h / 2, w / 2);
        let mut expected = Vec::new();
        for bh in 0..gh / 2 {
            for bw in 0..gw / 2 {
                for mh in 0..2 {
                    for mw in 0..2 {
                        for c in 0..3 {
                            for frame in &frames {
                                for py in 0..2 {
                                    for px in 0..2 {
                                        let y = (bh * 2 + mh) * 2 + py;
                                        let x = (bw * 2 + mw) * 2 + px;
                                        expected.push(f32::from(frame[(y * w + x) * 3 + c]));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(out, expected);
    }
}

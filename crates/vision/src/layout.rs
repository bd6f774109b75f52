//! Writing normalised pixels into the encoder's tensor layouts, once each:
//! Qwen's patch rows and CLIP's planar CHW.

use rayon::prelude::*;

use crate::image::RgbView;
use crate::normalize::{Lut, OutElem};

/// Qwen-VL patch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PatchGeometry {
    /// Spatial patch size P.
    pub patch_size: usize,
    /// Spatial merge size M.
    pub merge_size: usize,
    /// Temporal patch size T (a still image fills all T slots).
    pub temporal_patch_size: usize,
}

impl PatchGeometry {
    /// Width of one output row: C·T·P·P.
    pub fn row_len(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Resize granularity P·M.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }
}

/// Writes `img` (dimensions multiples of P·M) as Qwen patch rows.
///
/// Rows are ordered (h/M, w/M, m_h, m_w); a row holds (C, T, p_y, p_x).
pub(crate) fn patchify<T: OutElem>(
    img: RgbView<'_>,
    geo: PatchGeometry,
    lut: &Lut<T>,
    out: &mut [T],
    parallel: bool,
) {
    let (p, m) = (geo.patch_size, geo.merge_size);
    let grid_w = img.width() / p;
    let band_len = grid_w * m * geo.row_len();
    let band = |(bh, rows): (usize, &mut [T])| {
        for (i, row) in rows.chunks_exact_mut(geo.row_len()).enumerate() {
            let (bw, mh, mw) = (i / (m * m), (i / m) % m, i % m);
            fill_patch_row(img, geo, bh * m + mh, bw * m + mw, lut, row);
        }
    };
    if parallel {
        out.par_chunks_mut(band_len).enumerate().for_each(band);
    } else {
        out.chunks_mut(band_len).enumerate().for_each(band);
    }
}

/// One patch (`gy`, `gx`): the three channel planes, each repeated T times.
#[inline(always)]
fn fill_patch_row<T: OutElem>(
    img: RgbView<'_>,
    geo: PatchGeometry,
    gy: usize,
    gx: usize,
    lut: &Lut<T>,
    row: &mut [T],
) {
    let p = geo.patch_size;
    let plane = p * p;
    let channel_stride = geo.temporal_patch_size * plane;
    let (r_plane, rest) = row.split_at_mut(channel_stride);
    let (g_plane, b_plane) = rest.split_at_mut(channel_stride);
    let data = img.data();
    for py in 0..p {
        let start = ((gy * p + py) * img.width() + gx * p) * 3;
        let src = &data[start..start + p * 3];
        let dst = py * p..(py + 1) * p;
        let (r, g, b) = (
            &mut r_plane[dst.clone()],
            &mut g_plane[dst.clone()],
            &mut b_plane[dst],
        );
        for (((px, r), g), b) in src.chunks_exact(3).zip(r).zip(g).zip(b) {
            *r = lut.0[0][usize::from(px[0])];
            *g = lut.0[1][usize::from(px[1])];
            *b = lut.0[2][usize::from(px[2])];
        }
    }
    for plane_block in [r_plane, g_plane, b_plane] {
        for t in 1..geo.temporal_patch_size {
            plane_block.copy_within(0..plane, t * plane);
        }
    }
}

/// Writes `img` as planar `[3, H, W]`.
pub(crate) fn planar_chw<T: OutElem>(img: RgbView<'_>, lut: &Lut<T>, out: &mut [T]) {
    let plane = img.width() * img.height();
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    for (((px, r), g), b) in img.data().chunks_exact(3).zip(r).zip(g).zip(b) {
        *r = lut.0[0][usize::from(px[0])];
        *g = lut.0[1][usize::from(px[1])];
        *b = lut.0[2][usize::from(px[2])];
    }
}

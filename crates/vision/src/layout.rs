//! Writing normalised pixels into the encoder's tensor layouts, once each:
//! Qwen's patch rows and CLIP's planar CHW.

use crate::image::RgbView;
use crate::normalize::{Lut, Normalization, OutElem};
use crate::patch_simd::PatchSimd;
use crate::stream;

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

/// Writes Qwen patch rows, one band of `P·M` image rows at a time.
///
/// Rows are ordered (h/M, w/M, m_h, m_w); a row holds (C, T, p_y, p_x).
/// Each row is assembled in a small cache-resident buffer and then streamed
/// to the output (see [`crate::stream`]): every output element is written
/// once. The AVX2 writer ([`PatchSimd`]) is used when it reproduces the
/// table exactly, the table otherwise.
pub(crate) struct PatchWriter<T> {
    geo: PatchGeometry,
    lut: Lut<T>,
    simd: Option<PatchSimd>,
}

impl<T: OutElem> PatchWriter<T> {
    /// A writer for `geo` with normalisation `norm`.
    pub(crate) fn new(geo: PatchGeometry, norm: &Normalization) -> Self {
        let lut = norm.lut::<T>();
        let simd = PatchSimd::new(geo, norm, &lut);
        PatchWriter { geo, lut, simd }
    }

    /// Output elements of one band of an image `width` pixels wide.
    pub(crate) fn band_len(&self, width: usize) -> usize {
        width / self.geo.patch_size * self.geo.merge_size * self.geo.row_len()
    }

    /// Writes the patch rows of `band` (`P·M` rows of the resized image,
    /// width a multiple of `P·M`) into `out`.
    pub(crate) fn band(&self, band: RgbView<'_>, out: &mut [T]) {
        let (geo, m) = (self.geo, self.geo.merge_size);
        let mut staging = vec![T::default(); geo.row_len()];
        for (i, row) in out.chunks_exact_mut(geo.row_len()).enumerate() {
            let (bw, mh, mw) = (i / (m * m), (i / m) % m, i % m);
            let (gy, gx) = (mh, bw * m + mw);
            match &self.simd {
                Some(simd) => simd.fill(band.data(), band.width(), gy, gx, &mut staging),
                None => fill_patch_row(band, geo, gy, gx, &self.lut, &mut staging),
            }
            stream::copy(row, &staging);
        }
        stream::fence();
    }
}

/// Writes a whole resized `img` (dimensions multiples of P·M) as Qwen patch
/// rows, band by band (the unfused path, kept for tests).
#[cfg(test)]
pub(crate) fn patchify<T: OutElem>(
    img: RgbView<'_>,
    geo: PatchGeometry,
    norm: &Normalization,
    out: &mut [T],
) {
    let writer = PatchWriter::<T>::new(geo, norm);
    let band_rows = geo.factor() * img.width() * 3;
    for (data, chunk) in img
        .data()
        .chunks_exact(band_rows)
        .zip(out.chunks_exact_mut(writer.band_len(img.width())))
    {
        let band = RgbView::new(data, img.width(), geo.factor()).expect("band view");
        writer.band(band, chunk);
    }
}

/// One patch (`gy`, `gx`): the three channel planes, each written T times.
/// Dispatches to a fully unrolled body for the shipped patch sizes.
#[inline(always)]
fn fill_patch_row<T: OutElem>(
    img: RgbView<'_>,
    geo: PatchGeometry,
    gy: usize,
    gx: usize,
    lut: &Lut<T>,
    row: &mut [T],
) {
    match (geo.patch_size, geo.temporal_patch_size) {
        (14, 2) => fill_patch::<T, 14, 2>(img, gy, gx, lut, row),
        (16, 2) => fill_patch::<T, 16, 2>(img, gy, gx, lut, row),
        _ => fill_patch_any(img, geo, gy, gx, lut, row),
    }
}

/// Patch body for compile-time `P` and `TP`: every value is looked up once
/// into temporal slot 0, which is then copied to the other slots.
#[inline(always)]
fn fill_patch<T: OutElem, const P: usize, const TP: usize>(
    img: RgbView<'_>,
    gy: usize,
    gx: usize,
    lut: &Lut<T>,
    row: &mut [T],
) {
    let plane = P * P;
    let data = img.data();
    let [lut_r, lut_g, lut_b] = &lut.0;
    let (planes, _) = row.as_chunks_mut::<P>();
    for py in 0..P {
        let start = ((gy * P + py) * img.width() + gx * P) * 3;
        let (src, _) = data[start..start + P * 3].as_chunks::<3>();
        let (r, g, b) = (py, TP * P + py, 2 * TP * P + py);
        for (x, px) in src.iter().enumerate() {
            planes[r][x] = lut_r[usize::from(px[0])];
            planes[g][x] = lut_g[usize::from(px[1])];
            planes[b][x] = lut_b[usize::from(px[2])];
        }
    }
    for c in 0..3 {
        let first = c * TP * plane;
        for t in 1..TP {
            row.copy_within(first..first + plane, first + t * plane);
        }
    }
}

/// Patch body for any geometry.
pub(crate) fn fill_patch_any<T: OutElem>(
    img: RgbView<'_>,
    geo: PatchGeometry,
    gy: usize,
    gx: usize,
    lut: &Lut<T>,
    row: &mut [T],
) {
    let (p, tp) = (geo.patch_size, geo.temporal_patch_size);
    let plane = p * p;
    let data = img.data();
    for py in 0..p {
        let start = ((gy * p + py) * img.width() + gx * p) * 3;
        let src = &data[start..start + p * 3];
        for (c, table) in lut.0.iter().enumerate() {
            for t in 0..tp {
                let at = (c * tp + t) * plane + py * p;
                for (v, px) in row[at..at + p].iter_mut().zip(src.chunks_exact(3)) {
                    *v = table[usize::from(px[c])];
                }
            }
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

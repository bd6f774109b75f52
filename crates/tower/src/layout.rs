//! Where each patch sits: per-patch (h, w) position ids in the merge-window
//! row order of `pixel_values`, the attention segments (`cu_seqlens`), and
//! Qwen2.5-VL's window permutation.
//!
//! Rows of `pixel_values` are ordered (t, h/M, w/M, m_h, m_w), so the M²
//! patches of one output token are consecutive. Full attention runs within
//! each frame (`cu_seqlens` repeats h·w once per frame). Qwen2.5-VL groups
//! merged tokens into windows of `window_size / M / P` tokens per side,
//! scanned row-major within a frame; the last window of a row or column may
//! be partial, and empty windows are dropped.

/// A half-open row range `[start, end)` that attends only within itself.
pub(crate) type Segment = (usize, usize);

/// `(h, w)` of every patch, in row order, for all images.
pub(crate) fn position_ids(grids: &[[usize; 3]], merge: usize) -> Vec<(usize, usize)> {
    let mut ids = Vec::with_capacity(grids.iter().map(|g| g[0] * g[1] * g[2]).sum());
    for &[t, h, w] in grids {
        for _ in 0..t {
            for bh in 0..h / merge {
                for bw in 0..w / merge {
                    for mh in 0..merge {
                        for mw in 0..merge {
                            ids.push((bh * merge + mh, bw * merge + mw));
                        }
                    }
                }
            }
        }
    }
    ids
}

/// One segment per frame of every image: full attention.
pub(crate) fn frame_segments(grids: &[[usize; 3]]) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut start = 0;
    for &[t, h, w] in grids {
        for _ in 0..t {
            segments.push((start, start + h * w));
            start += h * w;
        }
    }
    segments
}

/// Qwen2.5-VL's window order: `index[i]` is the merged token placed at
/// position `i`, and the windows as segments of patch rows in that order.
pub(crate) fn window_index(
    grids: &[[usize; 3]],
    merge: usize,
    window: usize,
) -> (Vec<usize>, Vec<Segment>) {
    let unit = merge * merge;
    let mut index = Vec::new();
    let mut segments = Vec::new();
    let mut offset = 0;
    for &[t, h, w] in grids {
        let (lh, lw) = (h / merge, w / merge);
        for frame in 0..t {
            let base = offset + frame * lh * lw;
            for wy in 0..lh.div_ceil(window) {
                for wx in 0..lw.div_ceil(window) {
                    let start = index.len();
                    for y in wy * window..((wy + 1) * window).min(lh) {
                        for x in wx * window..((wx + 1) * window).min(lw) {
                            index.push(base + y * lw + x);
                        }
                    }
                    segments.push((start * unit, index.len() * unit));
                }
            }
        }
        offset += t * lh * lw;
    }
    (index, segments)
}

/// Permutes groups of `unit` consecutive rows: group `i` of the result is
/// group `index[i]` of `rows` (each row `width` long).
pub(crate) fn gather_groups(rows: &[f32], width: usize, unit: usize, index: &[usize]) -> Vec<f32> {
    let group = width * unit;
    let mut out = Vec::with_capacity(rows.len());
    for &g in index {
        out.extend_from_slice(&rows[g * group..(g + 1) * group]);
    }
    out
}

/// Row indices that take groups of `unit` rows in `index` order.
pub(crate) fn expand_groups(index: &[usize], unit: usize) -> Vec<usize> {
    index
        .iter()
        .flat_map(|&g| g * unit..(g + 1) * unit)
        .collect()
}

/// The inverse permutation: `inverse(index)[index[i]] == i`.
pub(crate) fn inverse(index: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; index.len()];
    for (i, &g) in index.iter().enumerate() {
        inv[g] = i;
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_merge_windows() {
        let ids = position_ids(&[[1, 2, 4]], 2);
        assert_eq!(
            ids,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
    }

    #[test]
    fn frames_are_separate_segments() {
        assert_eq!(
            frame_segments(&[[2, 2, 2], [1, 4, 2]]),
            vec![(0, 4), (4, 8), (8, 16)]
        );
    }

    #[test]
    fn windows_cover_partial_edges() {
        // 3×5 merged tokens, windows of 2: rows {0,1},{2}, cols {0,1},{2,3},{4}.
        let (index, segments) = window_index(&[[1, 6, 10]], 2, 2);
        assert_eq!(index.len(), 15);
        assert_eq!(&index[..4], &[0, 1, 5, 6]);
        assert_eq!(&index[4..8], &[2, 3, 7, 8]);
        assert_eq!(&index[8..10], &[4, 9]);
        assert_eq!(segments.len(), 6);
        assert_eq!(segments[2], (32, 40));
        let mut sorted = index.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..15).collect::<Vec<_>>());
    }

    #[test]
    fn gather_groups_and_inverse() {
        let rows: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let index = [2, 0, 1];
        let g = gather_groups(&rows, 2, 2, &index);
        assert_eq!(&g[..4], &[8.0, 9.0, 10.0, 11.0]);
        assert_eq!(expand_groups(&index, 2), vec![4, 5, 0, 1, 2, 3]);
        let inv = inverse(&index);
        let back: Vec<usize> = inv.iter().map(|&i| index[i]).collect();
        assert_eq!(back, vec![0, 1, 2]);
    }
}

//! Writing float32 tensors as NumPy `.npy` (format version 1.0).

use std::io::Write;

/// Serialises `values` with `shape` as a little-endian float32 `.npy` file.
pub fn write_npy_f32(
    mut w: impl Write,
    shape: &[usize],
    values: impl Iterator<Item = f32>,
) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    // magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    let mut buf = Vec::with_capacity(64 * 1024);
    for v in values {
        buf.extend_from_slice(&v.to_le_bytes());
        if buf.len() >= 64 * 1024 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_data_follows() {
        let mut out = Vec::new();
        write_npy_f32(
            &mut out,
            &[2, 3],
            [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].into_iter(),
        )
        .unwrap();
        assert_eq!(&out[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)"), "{header}");
        assert_eq!(out.len(), 10 + hlen + 24);
        assert_eq!(&out[10 + hlen..10 + hlen + 4], &1.0f32.to_le_bytes());
    }
}

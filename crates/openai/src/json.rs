//! Small hand-written JSON writers for the hot path.
//!
//! Streaming writes one chunk per token, so the chunk serialiser appends
//! straight into the output buffer: strings are escaped run by run (only
//! `"`, `\` and control characters need escaping) and integers go through
//! `itoa`. The output is the same JSON `serde_json` would produce.

use bytes::BufMut;

/// Hex digits for `\u00XX` escapes.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a quoted, escaped JSON string.
pub fn write_str<B: BufMut>(out: &mut B, s: &str) {
    out.put_u8(b'"');
    write_escaped(out, s);
    out.put_u8(b'"');
}

/// Appends `s` escaped for the inside of a JSON string (no quotes).
pub fn write_escaped<B: BufMut>(out: &mut B, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.put_slice(&bytes[start..i]);
        write_escape(out, b);
        start = i + 1;
    }
    out.put_slice(&bytes[start..]);
}

/// Appends the escape sequence for one ASCII byte that needs escaping.
fn write_escape<B: BufMut>(out: &mut B, b: u8) {
    match b {
        b'"' => out.put_slice(b"\\\""),
        b'\\' => out.put_slice(b"\\\\"),
        b'\n' => out.put_slice(b"\\n"),
        b'\r' => out.put_slice(b"\\r"),
        b'\t' => out.put_slice(b"\\t"),
        0x08 => out.put_slice(b"\\b"),
        0x0c => out.put_slice(b"\\f"),
        _ => out.put_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xf)],
        ]),
    }
}

/// Appends `Some(s)` as a JSON string and `None` as `null`.
pub fn write_opt_str<B: BufMut>(out: &mut B, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.put_slice(b"null"),
    }
}

/// Appends an unsigned integer.
pub fn write_u64<B: BufMut>(out: &mut B, n: u64) {
    let mut buf = itoa::Buffer::new();
    out.put_slice(buf.format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_serde_json() {
        let samples = [
            "",
            "plain",
            "quote \" backslash \\ slash /",
            "ctl \u{0}\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}",
            "héllo 世界 🎉",
            "\u{2028}\u{2029}",
        ];
        for s in samples {
            let mut out = Vec::new();
            write_str(&mut out, s);
            let expected = serde_json::to_vec(s).unwrap_or_default();
            assert_eq!(out, expected, "{s:?}");
        }
    }

    #[test]
    fn writes_integers_and_null() {
        let mut out = Vec::new();
        write_u64(&mut out, 0);
        out.push(b',');
        write_u64(&mut out, u64::MAX);
        out.push(b',');
        write_opt_str(&mut out, None);
        assert_eq!(out, b"0,18446744073709551615,null");
    }
}

//! The tokenizer bundle: a deterministic stored (uncompressed) zip of the
//! files a client needs to tokenize and render prompts itself.
//!
//! The zip is written by hand: entries in a fixed order, method 0 (stored),
//! a fixed 1980-01-01 timestamp, CRC-32 computed here. The same files give
//! the same bytes, so the SHA-256 identifies the tokenizer.

use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::model_dir::files;
use crate::ModelError;

/// A zip of the tokenizer files and the hex SHA-256 of the zip bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerBundle {
    pub zip: Vec<u8>,
    pub sha256_hex: String,
}

/// Files that must be in the bundle.
pub const REQUIRED_FILES: &[&str] = &[files::TOKENIZER, files::TOKENIZER_CONFIG];

/// Files added to the bundle when they exist, after the required ones.
pub const OPTIONAL_FILES: &[&str] = &[
    files::SPECIAL_TOKENS_MAP,
    files::CHAT_TEMPLATE_JSON,
    files::CHAT_TEMPLATE_JINJA,
    files::VOCAB,
    files::MERGES,
    files::GENERATION_CONFIG,
];

/// Builds the bundle from the files in `root`.
pub(crate) fn build(root: &Path) -> Result<TokenizerBundle, ModelError> {
    let mut entries: Vec<(&str, Vec<u8>)> = Vec::new();
    for name in REQUIRED_FILES {
        let path = root.join(name);
        match read_if_exists(&path)? {
            Some(bytes) => entries.push((name, bytes)),
            None => return Err(ModelError::MissingFile { path }),
        }
    }
    for name in OPTIONAL_FILES {
        if let Some(bytes) = read_if_exists(&root.join(name))? {
            entries.push((name, bytes));
        }
    }
    let zip = stored_zip(&entries);
    let sha256_hex = sha256_hex(&zip);
    Ok(TokenizerBundle { zip, sha256_hex })
}

fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>, ModelError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ModelError::io(path, "read", e)),
    }
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const LOCAL_HEADER: u32 = 0x0403_4b50;
const CENTRAL_HEADER: u32 = 0x0201_4b50;
const END_OF_CENTRAL: u32 = 0x0605_4b50;
/// 1980-01-01 in MS-DOS date format (the earliest representable date).
const DOS_DATE: u16 = (1 << 5) | 1;
/// Version 2.0 of the zip specification.
const VERSION: u16 = 20;
/// General purpose flag bit 11: names are UTF-8.
const UTF8_NAMES: u16 = 1 << 11;

/// Writes a zip with every entry stored (no compression). Bundles are a few
/// megabytes at most, far below the zip32 limits.
fn stored_zip(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let crc = crc32(data);
        write_local_header(&mut out, name, data.len() as u32, crc);
        out.extend_from_slice(data);
        write_central_header(&mut central, name, data.len() as u32, crc, offset);
    }
    let central_offset = out.len() as u32;
    let central_size = central.len() as u32;
    out.extend_from_slice(&central);
    put32(&mut out, END_OF_CENTRAL);
    put16(&mut out, 0); // this disk
    put16(&mut out, 0); // disk with the central directory
    put16(&mut out, entries.len() as u16);
    put16(&mut out, entries.len() as u16);
    put32(&mut out, central_size);
    put32(&mut out, central_offset);
    put16(&mut out, 0); // comment length
    out
}

fn write_local_header(out: &mut Vec<u8>, name: &str, size: u32, crc: u32) {
    put32(out, LOCAL_HEADER);
    put16(out, VERSION);
    put16(out, UTF8_NAMES);
    put16(out, 0); // method: stored
    put16(out, 0); // time
    put16(out, DOS_DATE);
    put32(out, crc);
    put32(out, size); // compressed size
    put32(out, size); // uncompressed size
    put16(out, name.len() as u16);
    put16(out, 0); // extra length
    out.extend_from_slice(name.as_bytes());
}

fn write_central_header(out: &mut Vec<u8>, name: &str, size: u32, crc: u32, offset: u32) {
    put32(out, CENTRAL_HEADER);
    put16(out, VERSION); // made by
    put16(out, VERSION); // needed to extract
    put16(out, UTF8_NAMES);
    put16(out, 0); // method: stored
    put16(out, 0); // time
    put16(out, DOS_DATE);
    put32(out, crc);
    put32(out, size);
    put32(out, size);
    put16(out, name.len() as u16);
    put16(out, 0); // extra length
    put16(out, 0); // comment length
    put16(out, 0); // disk number
    put16(out, 0); // internal attributes
    put32(out, 0o100644 << 16); // external attributes: a regular file, rw-r--r--
    put32(out, offset);
    out.extend_from_slice(name.as_bytes());
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// CRC-32 (IEEE 802.3, reflected, as zip uses) with a 256-entry table.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc = CRC_TABLE[((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

const CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn empty_zip_is_just_the_end_record() {
        let zip = stored_zip(&[]);
        assert_eq!(zip.len(), 22);
        assert_eq!(&zip[..4], &END_OF_CENTRAL.to_le_bytes());
    }
}

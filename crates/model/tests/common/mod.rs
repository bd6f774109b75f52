//! Helpers shared by the integration tests: a minimal independent reader
//! for the stored zips the bundle produces.

#![allow(dead_code)]

use iris_testkit::crc32;

/// One entry of a stored zip: name and contents.
pub struct Entry {
    pub name: String,
    pub data: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the local entries of a stored zip, checking each CRC, and checks
/// that the end record counts the same number of entries.
pub fn read_stored_zip(zip: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut at = 0;
    while u32_at(zip, at) == 0x0403_4b50 {
        assert_eq!(u16_at(zip, at + 8), 0, "method must be stored");
        let crc = u32_at(zip, at + 14);
        let size = u32_at(zip, at + 18) as usize;
        assert_eq!(size, u32_at(zip, at + 22) as usize);
        let name_len = u16_at(zip, at + 26);
        let extra_len = u16_at(zip, at + 28);
        let name_start = at + 30;
        let data_start = name_start + name_len + extra_len;
        let name = String::from_utf8(zip[name_start..name_start + name_len].to_vec()).unwrap();
        let data = zip[data_start..data_start + size].to_vec();
        assert_eq!(crc32(&data), crc, "crc of {name}");
        entries.push(Entry { name, data });
        at = data_start + size;
    }
    let end = zip.len() - 22;
    assert_eq!(u32_at(zip, end), 0x0605_4b50, "end of central directory");
    assert_eq!(u16_at(zip, end + 10), entries.len());
    assert_eq!(
        u32_at(zip, end + 16) as usize,
        at,
        "central directory offset"
    );
    entries
}

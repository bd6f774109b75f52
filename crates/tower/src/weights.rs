//! Reading the tower's tensors from a Hugging Face checkpoint.
//!
//! A checkpoint is a model directory with `model.safetensors`, or with
//! `model.safetensors.index.json` and its shards, or a single `.safetensors`
//! file. Files are memory-mapped, so only the pages of the vision tensors are
//! read even when they share a shard with the language model. Keys are
//! looked up under `visual.` (the original Qwen2-VL / Qwen2.5-VL layout) or
//! `model.visual.` (what newer `transformers` saves). f32, bf16 and f16
//! tensors are converted to f32.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::TowerError;

/// The key prefixes of the vision tower, in the order they are tried.
pub const PREFIXES: [&str; 2] = ["visual.", "model.visual."];

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

/// One tensor's place in a mapped file.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the mapped file.
    start: usize,
    end: usize,
}

/// The vision tensors of a checkpoint, mapped and indexed by their key
/// without the prefix (`blocks.0.attn.qkv.weight`).
pub struct Checkpoint {
    maps: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
    prefix: &'static str,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field(
                "files",
                &self.maps.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Checkpoint {
    /// Opens a model directory or a single `.safetensors` file.
    pub fn open(path: &Path) -> Result<Checkpoint, TowerError> {
        let files = checkpoint_files(path)?;
        let mut maps = Vec::with_capacity(files.len());
        for file in files {
            let map = map_file(&file)?;
            maps.push((file, map));
        }
        let (prefix, entries) = index_vision_tensors(&maps)?;
        Ok(Checkpoint {
            maps,
            entries,
            prefix,
        })
    }

    /// The prefix the vision keys carry in this checkpoint.
    pub fn prefix(&self) -> &'static str {
        self.prefix
    }

    /// Names (without prefix) of all vision tensors, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Whether the tensor `name` (without prefix) is present.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The tensor `name` (without prefix) as f32, after checking its shape.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, TowerError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| TowerError::MissingWeight {
                name: name.to_string(),
                prefixes: PREFIXES.to_vec(),
            })?;
        if entry.shape != shape {
            return Err(TowerError::ShapeMismatch {
                name: format!("{}{name}", self.prefix),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let (path, map) = &self.maps[entry.file];
        let bytes = map.get(entry.start..entry.end).ok_or_else(|| {
            TowerError::format(path, format!("tensor `{name}` lies outside the file"))
        })?;
        to_f32(&format!("{}{name}", self.prefix), entry.dtype, bytes)
    }
}

/// The safetensors files of a checkpoint: the index's shards, the single
/// file, or the path itself.
fn checkpoint_files(path: &Path) -> Result<Vec<PathBuf>, TowerError> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let index = path.join(INDEX_FILE);
    if index.is_file() {
        return shards_from_index(path, &index);
    }
    let single = path.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(TowerError::format(
        path,
        format!("no {SINGLE_FILE} or {INDEX_FILE} (is this a model directory?)"),
    ))
}

/// The shards that hold at least one vision tensor, per the index's `weight_map`.
fn shards_from_index(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, TowerError> {
    let text = std::fs::read_to_string(index).map_err(|e| TowerError::io(index, "read", e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| TowerError::format(index, format!("not JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| TowerError::format(index, "no `weight_map` object"))?;
    let mut shards = BTreeSet::new();
    for (key, file) in map {
        if PREFIXES.iter().any(|p| key.starts_with(p)) {
            let file = file.as_str().ok_or_else(|| {
                TowerError::format(index, format!("weight_map[{key}] is not a string"))
            })?;
            shards.insert(file.to_string());
        }
    }
    if shards.is_empty() {
        return Err(TowerError::format(
            index,
            format!("weight_map has no key under {PREFIXES:?}"),
        ));
    }
    Ok(shards.into_iter().map(|f| dir.join(f)).collect())
}

#[allow(unsafe_code)]
fn map_file(path: &Path) -> Result<Mmap, TowerError> {
    let file = File::open(path).map_err(|e| TowerError::io(path, "open", e))?;
    // SAFETY: the map is read-only and lives as long as the checkpoint.
    // Checkpoints are not modified while a worker serves them; a file
    // truncated underneath us would be a deployment error, as for any
    // memory-mapped model loader.
    unsafe { Mmap::map(&file) }.map_err(|e| TowerError::io(path, "memory-map", e))
}

type Indexed = (&'static str, HashMap<String, Entry>);

/// Indexes the tensors under the first prefix that has any, across all files.
fn index_vision_tensors(maps: &[(PathBuf, Mmap)]) -> Result<Indexed, TowerError> {
    let mut all: Vec<(usize, String, Entry)> = Vec::new();
    for (file, (path, map)) in maps.iter().enumerate() {
        let (header, metadata) = SafeTensors::read_metadata(map)
            .map_err(|e| TowerError::format(path, format!("not a safetensors file: {e}")))?;
        let base = 8 + header;
        for (name, info) in metadata.tensors() {
            let (from, to) = info.data_offsets;
            let entry = Entry {
                file,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: base + from,
                end: base + to,
            };
            all.push((file, name, entry));
        }
    }
    for prefix in PREFIXES {
        let entries: HashMap<String, Entry> = all
            .iter()
            .filter_map(|(_, name, entry)| {
                name.strip_prefix(prefix)
                    .map(|rest| (rest.to_string(), entry.clone()))
            })
            .collect();
        if !entries.is_empty() {
            return Ok((prefix, entries));
        }
    }
    let files: Vec<&Path> = maps.iter().map(|(p, _)| p.as_path()).collect();
    Err(TowerError::format(
        files.first().copied().unwrap_or(Path::new("")),
        format!("no tensor under {PREFIXES:?} in {files:?}"),
    ))
}

/// Converts little-endian f32 / bf16 / f16 bytes to f32.
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, TowerError> {
    let values = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        other => {
            return Err(TowerError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(values)
}

//! Tensor descriptions on the wire: element types, shape checks and inline
//! payload helpers shared by every sender and receiver of [`TensorData`].

use bytes::Bytes;

use crate::scheduler::{tensor_data::Payload, TensorData};

/// Element type of a [`TensorData`], as named in its `dtype` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Float32,
    BFloat16,
    Float16,
    Int64,
    UInt32,
    UInt8,
}

impl DType {
    /// Every dtype Iris understands, in wire spelling.
    pub const ALL: [DType; 6] = [
        DType::Float32,
        DType::BFloat16,
        DType::Float16,
        DType::Int64,
        DType::UInt32,
        DType::UInt8,
    ];

    /// Parses a wire name ("float32", "bfloat16", ...).
    pub fn parse(name: &str) -> Result<DType, TensorError> {
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == name)
            .ok_or_else(|| TensorError::UnknownDType(name.to_owned()))
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::BFloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Int64 => "int64",
            DType::UInt32 => "uint32",
            DType::UInt8 => "uint8",
        }
    }

    /// The value 1 as one element's little-endian bytes.
    pub fn one(self) -> &'static [u8] {
        match self {
            DType::Float32 => &[0x00, 0x00, 0x80, 0x3F],
            DType::BFloat16 => &[0x80, 0x3F],
            DType::Float16 => &[0x00, 0x3C],
            DType::Int64 => &[1, 0, 0, 0, 0, 0, 0, 0],
            DType::UInt32 => &[1, 0, 0, 0],
            DType::UInt8 => &[1],
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Float32 | DType::UInt32 => 4,
            DType::BFloat16 | DType::Float16 => 2,
            DType::Int64 => 8,
            DType::UInt8 => 1,
        }
    }
}

/// Why a [`TensorData`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error(
        "unknown dtype {0:?} (expected one of float32, bfloat16, float16, int64, uint32, uint8)"
    )]
    UnknownDType(String),
    #[error("tensor shape {0:?} overflows the addressable size")]
    ShapeOverflow(Vec<u32>),
    #[error(
        "tensor of shape {shape:?} and dtype {dtype} needs {expected} bytes but carries {actual}"
    )]
    SizeMismatch {
        shape: Vec<u32>,
        dtype: &'static str,
        expected: u64,
        actual: u64,
    },
    #[error("tensor has no payload")]
    MissingPayload,
}

/// Number of bytes a tensor of `shape` and `dtype` occupies.
pub fn byte_len(shape: &[u32], dtype: DType) -> Result<u64, TensorError> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(u64::from(d)))
        .ok_or_else(|| TensorError::ShapeOverflow(shape.to_vec()))
}

/// Checks dtype, and that the payload's declared or actual length equals
/// shape × dtype size. Returns the parsed dtype and the byte length.
pub fn validate(tensor: &TensorData) -> Result<(DType, u64), TensorError> {
    let dtype = DType::parse(&tensor.dtype)?;
    let expected = byte_len(&tensor.shape, dtype)?;
    let actual = match &tensor.payload {
        Some(Payload::Inline(bytes)) => bytes.len() as u64,
        Some(Payload::Shm(handle)) => handle.nbytes,
        Some(Payload::Remote(handle)) => handle.nbytes,
        None => return Err(TensorError::MissingPayload),
    };
    if actual != expected {
        return Err(TensorError::SizeMismatch {
            shape: tensor.shape.clone(),
            dtype: dtype.as_str(),
            expected,
            actual,
        });
    }
    Ok((dtype, expected))
}

/// A tensor whose bytes travel inside the message.
pub fn inline(shape: Vec<u32>, dtype: DType, data: Bytes) -> TensorData {
    TensorData {
        shape,
        dtype: dtype.as_str().to_owned(),
        payload: Some(Payload::Inline(data)),
    }
}

/// An int64 tensor from values (e.g. Qwen-VL's `image_grid_thw`).
pub fn int64(shape: Vec<u32>, values: &[i64]) -> TensorData {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    inline(shape, DType::Int64, Bytes::from(bytes))
}

/// A float32 tensor from values (e.g. Qwen2.5-VL's `second_per_grid_ts`).
pub fn float32(shape: Vec<u32>, values: &[f32]) -> TensorData {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    inline(shape, DType::Float32, Bytes::from(bytes))
}

/// Reads an inline int64 tensor's values; `None` if it is not one.
pub fn read_int64(tensor: &TensorData) -> Option<Vec<i64>> {
    if tensor.dtype != DType::Int64.as_str() {
        return None;
    }
    let Some(Payload::Inline(bytes)) = &tensor.payload else {
        return None;
    };
    if bytes.len() % 8 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.as_str()), Ok(d));
        }
        assert!(matches!(
            DType::parse("f32"),
            Err(TensorError::UnknownDType(_))
        ));
    }

    #[test]
    fn validate_checks_size() {
        let ok = inline(vec![2, 3], DType::Float32, Bytes::from(vec![0u8; 24]));
        assert_eq!(validate(&ok), Ok((DType::Float32, 24)));
        let short = inline(vec![2, 3], DType::Float32, Bytes::from(vec![0u8; 23]));
        let err = validate(&short).unwrap_err();
        assert!(
            err.to_string().contains("needs 24 bytes but carries 23"),
            "{err}"
        );
        let empty = TensorData {
            shape: vec![1],
            dtype: "int64".into(),
            payload: None,
        };
        assert_eq!(validate(&empty), Err(TensorError::MissingPayload));
    }

    #[test]
    fn shape_overflow_is_an_error() {
        let t = inline(
            vec![u32::MAX, u32::MAX, u32::MAX],
            DType::Int64,
            Bytes::new(),
        );
        assert!(matches!(validate(&t), Err(TensorError::ShapeOverflow(_))));
    }

    #[test]
    fn int64_round_trip() {
        let t = int64(vec![1, 3], &[1, 54, -74]);
        assert_eq!(read_int64(&t), Some(vec![1, 54, -74]));
        assert_eq!(validate(&t), Ok((DType::Int64, 24)));
    }
}

//! How much an entry weighs: the [`Weighted`] trait used by
//! [`SingleFlightCache::new`](crate::SingleFlightCache::new), with
//! implementations for common buffers.

/// A value that knows how many bytes it holds, for the cache's byte bound.
///
/// The weight should be what dropping the value would free (its heap
/// buffers), and must not change while the value is cached: the cache
/// weighs each value once, when it is stored.
pub trait Weighted {
    /// Bytes this value holds.
    fn weight_bytes(&self) -> usize;
}

impl<T> Weighted for Vec<T> {
    fn weight_bytes(&self) -> usize {
        self.len().saturating_mul(size_of::<T>())
    }
}

impl<T> Weighted for Box<[T]> {
    fn weight_bytes(&self) -> usize {
        self.len().saturating_mul(size_of::<T>())
    }
}

impl Weighted for String {
    fn weight_bytes(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Weighted;

    #[test]
    fn buffers_weigh_their_elements() {
        assert_eq!(vec![0f32; 10].weight_bytes(), 40);
        assert_eq!(vec![0u16; 3].into_boxed_slice().weight_bytes(), 6);
        assert_eq!(String::from("abc").weight_bytes(), 3);
        assert_eq!(Vec::<u64>::new().weight_bytes(), 0);
    }
}

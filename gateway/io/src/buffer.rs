//! Packet buffers allocated once per data-path task and reused for every batch.
//!
//! [`PacketBuf`] is a fixed-capacity byte buffer with a length, so it can stand in for a
//! `Vec<u8>` where tun-rs's GRO wants to grow the first packet of a flow into a super-packet
//! ([`tun_rs::ExpandBuffer`]), without the zero-fill a `Vec::resize` would cost on every reuse
//! and without ever reallocating. [`BufferPool`] is a fixed set of them, handed out in order
//! and recycled whole after each batch.

use tun_rs::ExpandBuffer;

/// A byte buffer of fixed capacity: the visible bytes are `storage[..len]`.
///
/// Growing beyond the capacity panics; tun-rs checks [`ExpandBuffer::buf_capacity`] before
/// it extends a buffer, and the data path sizes every buffer for the largest packet it accepts.
#[derive(Clone)]
pub struct PacketBuf {
    storage: Box<[u8]>,
    len: usize,
}

impl PacketBuf {
    /// A buffer of `capacity` bytes whose visible length is the whole capacity, ready to be
    /// read into. The memory comes zeroed from the allocator, so pages are only committed
    /// once touched.
    pub fn new(capacity: usize) -> Self {
        Self {
            storage: vec![0u8; capacity].into_boxed_slice(),
            len: capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.storage.len()
    }

    /// Sets the visible length (at most the capacity). The bytes keep whatever they held.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.storage.len(),
            "PacketBuf length beyond capacity"
        );
        self.len = len;
    }

    /// Makes the whole capacity visible again.
    pub fn reset(&mut self) {
        self.len = self.storage.len();
    }

    /// The whole capacity, whatever the visible length.
    pub fn whole_mut(&mut self) -> &mut [u8] {
        &mut self.storage
    }
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBuf")
            .field("len", &self.len)
            .field("capacity", &self.storage.len())
            .finish()
    }
}

impl AsRef<[u8]> for PacketBuf {
    fn as_ref(&self) -> &[u8] {
        &self.storage[..self.len]
    }
}

impl AsMut<[u8]> for PacketBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[..self.len]
    }
}

impl ExpandBuffer for PacketBuf {
    fn buf_capacity(&self) -> usize {
        self.storage.len()
    }

    fn buf_resize(&mut self, new_len: usize, value: u8) {
        let old_len = self.len;
        self.set_len(new_len);
        if new_len > old_len {
            self.storage[old_len..new_len].fill(value);
        }
    }

    fn buf_extend_from_slice(&mut self, src: &[u8]) {
        let end = self.len + src.len();
        self.storage[self.len..end].copy_from_slice(src);
        self.len = end;
    }
}

/// A fixed set of equally sized [`PacketBuf`]s used front to back within a batch.
#[derive(Debug)]
pub struct BufferPool {
    buffers: Vec<PacketBuf>,
    used: usize,
}

impl BufferPool {
    /// `count` buffers of `capacity` bytes each.
    pub fn new(count: usize, capacity: usize) -> Self {
        Self {
            buffers: (0..count).map(|_| PacketBuf::new(capacity)).collect(),
            used: 0,
        }
    }

    /// How many buffers the pool holds.
    pub fn count(&self) -> usize {
        self.buffers.len()
    }

    /// How many buffers are in use in the current batch.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether every buffer is in use.
    pub fn is_full(&self) -> bool {
        self.used == self.buffers.len()
    }

    /// The next free buffer at full length, or `None` when all are in use. It counts as used
    /// only after [`BufferPool::commit`].
    pub fn next_free(&mut self) -> Option<&mut PacketBuf> {
        let buffer = self.buffers.get_mut(self.used)?;
        buffer.reset();
        Some(buffer)
    }

    /// How many buffers are free.
    pub fn free(&self) -> usize {
        self.buffers.len() - self.used
    }

    /// Marks the buffer last returned by [`BufferPool::next_free`] as used, with `len`
    /// visible bytes.
    pub fn commit(&mut self, len: usize) {
        self.buffers[self.used].set_len(len);
        self.used += 1;
    }

    /// The free buffers, in the order they would be used (their lengths as they were).
    pub fn free_mut(&mut self) -> &mut [PacketBuf] {
        &mut self.buffers[self.used..]
    }

    /// Marks the free buffer `skip` places after the first free one as the next one used,
    /// with `len` visible bytes: it changes places with the first free one.
    pub fn commit_at(&mut self, skip: usize, len: usize) {
        self.buffers.swap(self.used, self.used + skip);
        self.commit(len);
    }

    /// The buffers in use, in commit order.
    pub fn used_mut(&mut self) -> &mut [PacketBuf] {
        &mut self.buffers[..self.used]
    }

    /// The buffers in use, in commit order.
    pub fn used_slice(&self) -> &[PacketBuf] {
        &self.buffers[..self.used]
    }

    /// All buffers, for a reader that fills them itself.
    pub fn all_mut(&mut self) -> &mut [PacketBuf] {
        &mut self.buffers
    }

    /// Forgets the current batch; every buffer is free again.
    pub fn clear(&mut self) {
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committing_later_free_buffers_keeps_their_order_and_leaves_no_hole() {
        let mut pool = BufferPool::new(5, 8);
        for (n, buffer) in pool.free_mut().iter_mut().enumerate() {
            buffer.whole_mut()[0] = n as u8;
        }
        // Buffers 0 and 2 are refused, 1, 3 and 4 committed in order: each at its index
        // less the number committed before it.
        for (index, committed) in [(1, 0), (3, 1), (4, 2)] {
            pool.commit_at(index - committed, 1);
        }
        let firsts: Vec<u8> = pool.used_slice().iter().map(|b| b.as_ref()[0]).collect();
        assert_eq!(firsts, [1, 3, 4]);
        assert_eq!(pool.free(), 2);
    }

    #[test]
    fn expands_within_capacity_without_reallocating() {
        let mut buffer = PacketBuf::new(64);
        buffer.set_len(4);
        buffer.as_mut().copy_from_slice(b"abcd");
        let before = buffer.as_ref().as_ptr();
        buffer.buf_extend_from_slice(b"ef");
        assert_eq!(buffer.as_ref(), b"abcdef");
        buffer.buf_resize(8, b'z');
        assert_eq!(buffer.as_ref(), b"abcdefzz");
        buffer.buf_resize(2, 0);
        assert_eq!(buffer.as_ref(), b"ab");
        assert_eq!(buffer.buf_capacity(), 64);
        assert_eq!(buffer.as_ref().as_ptr(), before);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn refuses_to_grow_past_capacity() {
        let mut buffer = PacketBuf::new(4);
        buffer.buf_resize(5, 0);
    }

    #[test]
    fn pool_hands_out_buffers_in_order_and_recycles_them() {
        let mut pool = BufferPool::new(2, 16);
        pool.next_free().expect("free").as_mut()[..3].copy_from_slice(b"one");
        pool.commit(3);
        pool.next_free().expect("free").as_mut()[..3].copy_from_slice(b"two");
        pool.commit(3);
        assert!(pool.is_full());
        assert!(pool.next_free().is_none());
        let contents: Vec<&[u8]> = pool.used_slice().iter().map(AsRef::as_ref).collect();
        assert_eq!(contents, [b"one".as_slice(), b"two".as_slice()]);
        pool.clear();
        assert_eq!(pool.used(), 0);
        assert_eq!(pool.next_free().expect("free").as_ref().len(), 16);
    }
}

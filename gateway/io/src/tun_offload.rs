//! Batched TUN I/O, with the virtio-net offloads of tun-rs when the device was built with
//! `offload(true)` (`IFF_VNET_HDR` plus TSO/USO).
//!
//! - [`TunReader`]: one wait for readability, then non-blocking reads until the batch is
//!   full or the queue is empty. With offloads one read returns a TCP/UDP super-packet of up
//!   to 64 KiB that tun-rs splits into MTU-sized packets with complete checksums; without,
//!   each read is one packet and only the syscalls are not saved.
//! - [`TunWriter`]: packets are decrypted straight into 64 KiB-capacity buffers behind a
//!   virtio header's room; [`TunWriter::flush`] coalesces same-flow TCP and UDP packets into
//!   super-packets ([`super::gro`], in place: tun-rs's `send_multiple` copies every packet
//!   into a fresh `Vec` first) and writes one per flow run, so the kernel sees a few large
//!   packets instead of many small ones.
//!
//! The same code serves devices with and without offloads; tun-rs (reads) and the writer
//! look at the device's flags. No allocation happens after construction.

use std::io;

use kubetun_gateway_core::PacketSink;
use tun_rs::{AsyncDevice, VIRTIO_NET_HDR_LEN};

use super::buffer::{BufferPool, PacketBuf};
use super::gro::Coalescer;

/// Largest IP packet.
pub const MAX_IP_PACKET: usize = 65_535;
/// Raw read buffer: a virtio header and a 64 KiB super-packet.
const RAW_READ_LEN: usize = VIRTIO_NET_HDR_LEN + MAX_IP_PACKET;
/// Buffers kept free for one read: a 64 KiB super-packet split at a segment size of 512
/// bytes or more fits. A read never starts with fewer free buffers, so no super-packet
/// is refused for lack of room in the usual case.
pub const SEGMENTS_PER_READ: usize = 128;
/// Room in front of every packet handed to [`TunWriter`]: the virtio header.
pub const WRITE_OFFSET: usize = VIRTIO_NET_HDR_LEN;
/// Capacity of a write buffer: a coalesced super-packet, its header room, and the slack
/// tun-rs requires before it grows a buffer (twice the offset).
const WRITE_CAPACITY: usize = 2 * WRITE_OFFSET + MAX_IP_PACKET;

/// Reads batches of packets from the TUN device.
pub struct TunReader {
    raw: Box<[u8]>,
    buffers: Vec<PacketBuf>,
    sizes: Vec<usize>,
    batch: usize,
    count: usize,
    skipped: u64,
}

impl std::fmt::Debug for TunReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunReader")
            .field("batch", &self.batch)
            .field("count", &self.count)
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl TunReader {
    /// A reader that stops reading once a batch holds `batch` packets (at least 1).
    pub fn new(batch: usize) -> Self {
        let batch = batch.max(1);
        let buffers = batch - 1 + SEGMENTS_PER_READ;
        Self {
            raw: vec![0u8; RAW_READ_LEN].into_boxed_slice(),
            buffers: (0..buffers)
                .map(|_| PacketBuf::new(MAX_IP_PACKET))
                .collect(),
            sizes: vec![0; buffers],
            batch,
            count: 0,
            skipped: 0,
        }
    }

    /// Waits for the device to be readable, then reads until the batch is full or nothing
    /// is queued. Returns the number of packets. A read tun-rs cannot parse (a malformed
    /// virtio header or super-packet) is skipped and counted ([`TunReader::take_skipped`]); an
    /// OS error of the device is returned.
    pub async fn recv(&mut self, tun: &AsyncDevice) -> io::Result<usize> {
        self.count = 0;
        loop {
            let buffers = &mut self.buffers[..];
            buffers.iter_mut().for_each(PacketBuf::reset);
            match tun
                .recv_multiple(&mut self.raw, buffers, &mut self.sizes, 0)
                .await
            {
                Ok(read) => {
                    self.count = read;
                    break;
                }
                Err(error) => self.skip(error)?,
            }
        }
        while self.count < self.batch {
            let free = &mut self.buffers[self.count..];
            let sizes = &mut self.sizes[self.count..];
            free.iter_mut().for_each(PacketBuf::reset);
            match tun.try_recv_multiple(&mut self.raw, free, sizes, 0) {
                Ok(read) => self.count += read,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => self.skip(error)?,
            }
        }
        for (buffer, size) in self.buffers[..self.count].iter_mut().zip(&self.sizes) {
            buffer.set_len(*size);
        }
        Ok(self.count)
    }

    /// Counts a read that failed inside tun-rs (no OS error: the packet was read but not
    /// usable); returns OS errors other than an interrupted call.
    fn skip(&mut self, error: io::Error) -> io::Result<()> {
        match error.raw_os_error() {
            Some(code) if code == libc::EINTR => Ok(()),
            Some(_) => Err(error),
            None => {
                tracing::trace!(%error, "unusable TUN read skipped");
                self.skipped += 1;
                Ok(())
            }
        }
    }

    /// The packets of the last batch, in read order.
    pub fn packets(&self) -> &[PacketBuf] {
        &self.buffers[..self.count]
    }

    /// The packets of the last batch, in read order, for rewriting in place.
    pub fn packets_mut(&mut self) -> &mut [PacketBuf] {
        &mut self.buffers[..self.count]
    }

    /// How many packets the last batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the last batch is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Reads skipped since the last call (see [`TunReader::recv`]), resetting the count.
    pub fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }
}

/// Collects packets for the TUN device and writes them with GRO coalescing.
pub struct TunWriter {
    pool: BufferPool,
    gro: Coalescer,
}

impl std::fmt::Debug for TunWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunWriter")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl TunWriter {
    /// Room for `batch` packets (at least 1) per flush.
    pub fn new(batch: usize) -> Self {
        Self {
            pool: BufferPool::new(batch.max(1), WRITE_CAPACITY),
            gro: Coalescer::new(batch.max(1)),
        }
    }

    /// Space for the next packet (up to [`MAX_IP_PACKET`] bytes), or `None` when the batch is
    /// full and must be flushed first. Write the packet at the start, then
    /// [`TunWriter::commit`] its length.
    pub fn space(&mut self) -> Option<&mut [u8]> {
        let buffer = self.pool.next_free()?;
        Some(&mut buffer.as_mut()[WRITE_OFFSET..WRITE_OFFSET + MAX_IP_PACKET])
    }

    /// Adds the `len`-byte packet just written into [`TunWriter::space`].
    pub fn commit(&mut self, len: usize) {
        self.pool.commit(WRITE_OFFSET + len);
    }

    /// Copies `packet` in and commits it; `false` (nothing added) when the batch is full.
    pub fn push(&mut self, packet: &[u8]) -> bool {
        let Some(space) = self.space() else {
            return false;
        };
        let Some(target) = space.get_mut(..packet.len()) else {
            return false;
        };
        target.copy_from_slice(packet);
        self.commit(packet.len());
        true
    }

    /// Packets waiting to be written.
    pub fn len(&self) -> usize {
        self.pool.used()
    }

    /// Whether nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.pool.used() == 0
    }

    /// Whether no packet can be added before a flush.
    pub fn is_full(&self) -> bool {
        self.pool.is_full()
    }

    /// The packets waiting to be written, in commit order.
    pub fn packets(&self) -> impl Iterator<Item = &[u8]> {
        self.pool
            .used_slice()
            .iter()
            .map(|packet| &packet.as_ref()[WRITE_OFFSET..])
    }

    /// Forgets the pending packets without writing them.
    pub fn clear(&mut self) {
        self.pool.clear();
    }

    /// Writes every pending packet (coalesced where the device has offloads) and empties
    /// the batch, whether or not a write failed. Returns the bytes written; an error is the
    /// last failed write's.
    pub async fn flush(&mut self, tun: &AsyncDevice) -> io::Result<usize> {
        if self.pool.used() == 0 {
            return Ok(0);
        }
        // `tcp_gso` means the device was opened with virtio headers (and TSO).
        let result = if tun.tcp_gso() {
            self.gro
                .coalesce(self.pool.used_mut(), WRITE_OFFSET, tun.udp_gso());
            let packets = self.pool.used_slice();
            let from = WRITE_OFFSET - VIRTIO_NET_HDR_LEN;
            write_all(
                tun,
                self.gro
                    .writes()
                    .iter()
                    .map(|&i| &packets[i].as_ref()[from..]),
            )
            .await
        } else {
            let packets = self.pool.used_slice();
            write_all(tun, packets.iter().map(|p| &p.as_ref()[WRITE_OFFSET..])).await
        };
        self.pool.clear();
        result
    }
}

/// The core decrypts straight into the writer's buffers, several at once when workers open
/// a run in parts.
impl PacketSink for TunWriter {
    type Slot = PacketBuf;

    fn room(&self) -> usize {
        self.pool.free()
    }

    fn free_slots(&mut self) -> &mut [PacketBuf] {
        self.pool.free_mut()
    }

    fn slot_space(slot: &mut PacketBuf) -> &mut [u8] {
        &mut slot.whole_mut()[WRITE_OFFSET..WRITE_OFFSET + MAX_IP_PACKET]
    }

    fn commit_slot(&mut self, skip: usize, len: usize) {
        self.pool.commit_at(skip, WRITE_OFFSET + len);
    }
}

/// Writes each packet; a failed write does not stop the others (except a device that is
/// gone). Returns the bytes written, or the last error.
async fn write_all<'a>(
    tun: &AsyncDevice,
    packets: impl Iterator<Item = &'a [u8]>,
) -> io::Result<usize> {
    let mut written = 0;
    let mut failure = None;
    for packet in packets {
        match tun.send(packet).await {
            Ok(len) => written += len,
            Err(error) if error.raw_os_error() == Some(libc::EBADFD) => return Err(error),
            Err(error) => failure = Some(error),
        }
    }
    failure.map_or(Ok(written), Err)
}

#[cfg(test)]
mod tests;

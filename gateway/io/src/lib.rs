//! kubetun-gateway-io: the gateway's syscall layer, the kernel interfaces that decide
//! throughput, in a crate of their own so that the shell's other modules hold almost no
//! `unsafe` (every site here has its SAFETY note).
//!
//! - [`udp_batch`]: `recvmmsg`/`sendmmsg` with UDP GRO and GSO and `IP_PKTINFO` /
//!   `IPV6_PKTINFO` on the WireGuard sockets, filling and draining the core's arenas.
//! - [`tun_offload`]: TUN reads and writes in batches, with tun-rs's virtio-net offloads
//!   (TSO/USO super-packets split on read, GRO coalescing on write).
//! - [`gro`]: the in-place coalescing of TUN writes.
//! - [`buffer`]: the preallocated buffers both use; nothing allocates per packet.
//!
//! Its calls fail with the kernel's `std::io::Error`, unchanged: the shell decides what a
//! failed send or read means, so an error enum of its own would only rename errno.

pub mod buffer;
pub mod gro;
pub mod tun_offload;
pub mod udp_batch;

#[cfg(test)]
mod testns;

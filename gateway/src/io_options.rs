//! Which I/O techniques the data path uses ([`IoOptions`]), each switchable on its own so
//! its effect can be measured in isolation, and the size of what it allocates at start; the syscalls themselves are
//! `kubetun-gateway-io`'s.

/// Packets per batch unless configured otherwise (wireguard-go's `IdealBatchSize`).
pub const DEFAULT_BATCH_SIZE: usize = 128;
/// Data-path queues unless configured otherwise: one TUN queue read by one task, one UDP
/// socket per family read by one task each (see [`IoOptions::queues`]). Two queues measured
/// no faster in the two-core netns harness (one peer, whose encryption serializes on its
/// lock anyway), so more queues are opt-in.
pub const DEFAULT_QUEUES: usize = 1;
/// Most data-path queues (a TUN device has at most 256; more than the cores buys nothing).
pub const MAX_QUEUES: usize = 64;

/// Crypto workers unless configured otherwise: half the cores (1, no helper thread, below
/// four). The other half is the kernel's: the same traffic costs it about as much CPU
/// (TUN, UDP, softirq) as the crypto costs us. On the two-core benchmark machine, where two
/// gateways and both iperf3 ends share the cores, a helper cut single-stream TCP by a
/// quarter (RESULTS.md), so there is none.
pub fn default_crypto_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

/// Which I/O techniques the data path uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoOptions {
    /// Open the TUN device with virtio-net offloads (TSO/USO reads, GRO writes).
    pub tun_offload: bool,
    /// Send runs of equal-size datagrams as one UDP GSO message.
    pub udp_gso: bool,
    /// Receive coalesced datagrams with UDP GRO.
    pub udp_gro: bool,
    /// Most packets handled per batch (1 turns batching off; at most
    /// [`kubetun_gateway_core::batch::MAX_BATCH`]).
    pub batch_size: usize,
    /// Data-path queues (1..=[`MAX_QUEUES`]). With more than one, the TUN device is opened
    /// multi-queue (`IFF_MULTI_QUEUE`) with this many queues, each read and encrypted by its
    /// own task, and each address family gets a `SO_REUSEPORT` group of this many UDP
    /// sockets on the listen port, each read and decrypted by its own task: the kernel
    /// spreads flows over the TUN queues and peers over the sockets, so encryption and
    /// decryption run on several cores. 1 opens a plain TUN device and one socket per family.
    pub queues: usize,
    /// How long the data path keeps polling after a batch before its thread parks
    /// ([`crate::device::spin`]); zero parks at once. Only on a current-thread runtime,
    /// where one thread polls every descriptor.
    pub spin_window: std::time::Duration,
    /// Threads one peer's long run of packets is sealed or opened on, the data-path task's
    /// own included ([`crate::device::workers`]); 0 means [`default_crypto_workers`], 1 none
    /// beside it.
    pub crypto_workers: usize,
    /// Slots of the flow table (the connections this cluster opened towards remote
    /// clusters, whose replies an exported link admits), allocated once at start: 12 bytes
    /// each; 0 is [`kubetun_gateway_core::admission::flows::DEFAULT_CAPACITY`].
    pub flow_table_size: usize,
}

impl Default for IoOptions {
    fn default() -> Self {
        Self {
            tun_offload: true,
            udp_gso: true,
            udp_gro: true,
            batch_size: DEFAULT_BATCH_SIZE,
            queues: DEFAULT_QUEUES,
            spin_window: std::time::Duration::ZERO,
            crypto_workers: 0,
            flow_table_size: 0,
        }
    }
}

impl IoOptions {
    /// The batch size clamped to what the batch structures hold.
    pub fn batch(&self) -> usize {
        self.batch_size
            .clamp(1, kubetun_gateway_core::batch::MAX_BATCH)
    }

    /// Crypto workers per run: [`Self::crypto_workers`], or [`default_crypto_workers`] when
    /// that is 0.
    pub fn crypto_workers(&self) -> usize {
        match self.crypto_workers {
            0 => default_crypto_workers(),
            workers => workers,
        }
        .min(kubetun_gateway_core::workers::MAX_PARTS)
    }

    /// The flow table's capacity: [`Self::flow_table_size`], or the default when 0.
    pub fn flow_table_size(&self) -> usize {
        match self.flow_table_size {
            0 => kubetun_gateway_core::admission::flows::DEFAULT_CAPACITY,
            slots => slots.min(kubetun_gateway_core::admission::flows::MAX_CAPACITY),
        }
    }

    /// The number of queues clamped to `1..=`[`MAX_QUEUES`].
    pub fn queues(&self) -> usize {
        self.queues.clamp(1, MAX_QUEUES)
    }
}

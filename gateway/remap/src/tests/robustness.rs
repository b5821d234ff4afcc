//! Arbitrary and mutated input, including the committed fuzz corpus: nothing panics, and
//! whatever is forwarded keeps valid checksums.

use super::*;
use ipnet::IpNet;

proptest! {
    #[test]
    fn garbage_never_panics_and_keeps_valid_checksums(data in prop::collection::vec(any::<u8>(), 0..200)) {
        fuzz_check(&data);
    }

    #[test]
    fn prefetch_never_panics_on_a_hashed_table(
        data in prop::collection::vec(any::<u8>(), 0..64),
        version in 0u8..16,
    ) {
        let mut builder = TableBuilder::new();
        let routes: Vec<Route> = (0..40u32)
            .flat_map(|i| {
                let v4 = IpNet::new(IpAddr::from((0x0a00_0000 | (i << 8)).to_be_bytes()), 24);
                let v6 = IpNet::new(IpAddr::from(((0xfd00_u128 << 112) | (u128::from(i) << 64)).to_be_bytes()), 64);
                [v4, v6]
            })
            .map(|net| Route::unmapped(net.expect("valid length")))
            .collect();
        builder.add_peer(1, &routes, None).expect("valid routes");
        let table = builder.build().expect("valid table");
        let mut pkt = data;
        if let Some(first) = pkt.first_mut() {
            *first = (version << 4) | (*first & 0x0f);
        }
        table.prefetch_egress(&pkt);
    }

    #[test]
    fn mutated_corpus_packets_never_panic(
        base in prop::sample::select(corpus()),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        truncate in any::<prop::sample::Index>(),
    ) {
        let mut data = base;
        // Keep the selector byte; mutate the packet.
        for (index, value) in flips {
            let i = 1 + index.index(data.len() - 1);
            data[i] ^= value;
        }
        data.truncate(1 + truncate.index(data.len()));
        let (verdict, pkt) = fuzz_check(&data);
        if matches!(verdict, Verdict::Forward(_) | Verdict::Deliver)
            && etherparse::SlicedPacket::from_ip(&data[1..]).is_ok()
        {
            prop_assert!(etherparse::SlicedPacket::from_ip(&pkt).is_ok(), "still parses");
        }
    }

    #[test]
    fn mutated_real_packets_never_panic(
        l4 in l4_strategy(),
        egress in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        truncate in any::<prop::sample::Index>(),
    ) {
        let mut pkt = if egress {
            build(v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), l4, b"some payload bytes")
        } else {
            build(v6("fd00:70::1"), v6("fd00:200::5"), l4, b"some payload bytes")
        };
        for (index, value) in flips {
            let i = index.index(pkt.len());
            pkt[i] ^= value;
        }
        pkt.truncate(truncate.index(pkt.len() + 1));
        pkt.insert(0, if egress { 0 } else { 1 });
        fuzz_check(&pkt);
    }
}

/// Found by the fuzzer: protocol 58 (ICMPv6) inside IPv4 with IP options. The oracle once took
/// its checksum for a pseudo-header one; the rewrite leaves such payload untouched, as it must.
#[test]
fn icmpv6_inside_ipv4_is_opaque_payload() {
    let data = [
        0x00, 0x48, 0x00, 0x00, 0x26, 0xec, 0x32, 0x00, 0x00, 0x2d, 0x3a, 0x7a, 0x79, 0x0a, 0xc8,
        0x00, 0x01, 0x0a, 0x45, 0x2c, 0x00, 0x09, 0x14, 0xe9, 0x00, 0xc8, 0x00, 0x05, 0x0a, 0x45,
        0x00, 0x2a, 0x09, 0x14, 0xe9, 0x00, 0xc8, 0xa9, 0x00, 0x73, 0x75, 0x6d,
    ];
    let (verdict, pkt) = fuzz_check(&data);
    assert_eq!(verdict, Verdict::Forward(MILAN));
    assert_eq!(pkt[32..38], data[33..39], "the payload is not touched");
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/remap")
}

/// The committed corpus entries of at least two bytes (selector and packet).
fn corpus() -> Vec<Vec<u8>> {
    let entries = std::fs::read_dir(corpus_dir()).expect("corpus directory");
    let files = entries.map(|e| std::fs::read(e.expect("entry").path()).expect("corpus file"));
    files.filter(|data| data.len() >= 2).collect()
}

#[test]
fn committed_fuzz_corpus_replays_cleanly() {
    let dir = corpus_dir();
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let (verdict, pkt) = fuzz_check(&data);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("garbage") {
            assert_eq!(verdict, Verdict::Drop(DropReason::BadPacket), "{name}");
        } else {
            assert!(
                matches!(verdict, Verdict::Forward(_) | Verdict::Deliver),
                "{name}: {verdict:?}"
            );
            assert_checksums(&pkt);
        }
        replayed += 1;
    }
    assert!(replayed >= 10, "only {replayed} corpus files");
}

//! Arbitrary bytes through the remap fast path: the first byte picks egress or ingress (and the
//! peer), the rest is the packet. The oracle panics on any broken invariant: a panic in the
//! rewrite, a length change, or a checksum that was valid before and is not after. In addition,
//! a translated packet that etherparse could parse must still parse after the rewrite.
#![no_main]

use etherparse::SlicedPacket;
use kubetun_remap::{Verdict, fuzz_check};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (verdict, pkt) = fuzz_check(data);
    let translated = matches!(verdict, Verdict::Forward(_) | Verdict::Deliver);
    if translated && data.len() > 1 && SlicedPacket::from_ip(&data[1..]).is_ok() {
        assert!(SlicedPacket::from_ip(&pkt).is_ok(), "a parseable packet stays parseable");
    }
});

//! Arbitrary bytes through the WireGuard UAPI parser and the `set` semantics. The oracle
//! (`kubetun_gateway::uapi::fuzz_check`) panics on a panic in parsing or applying, or on a
//! resulting state that breaks an invariant (duplicate peers, one allowed IP on two peers).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kubetun_gateway::uapi::fuzz_check(data);
});

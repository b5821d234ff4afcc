//! Arbitrary bytes through the WireGuard UAPI parser, both operations. The oracle
//! (`kubetun_gateway::uapi::fuzz_check`) applies a `set` to an empty and a populated state,
//! answers a `get` and parses the reply back as a `set`, and panics on a panic, on a result
//! that breaks an invariant (duplicate peers, one allowed IP on two peers), or on an error
//! message that repeats request text (it could be key material).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kubetun_gateway::uapi::fuzz_check(data);
});

//! Arbitrary bytes through `kubetun gateway apply -f`'s state-file parser and the gateway's
//! conversion and validation of the result; the oracle is `controller/cli/fuzz/oracle.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check(data);
});

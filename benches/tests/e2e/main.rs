//! The benches crate's tests, one binary: the harness and the scale benches run small, in
//! network namespaces. Needs root. (The interop matrix is with the other interop tests, in
//! `kubetun-fixtures`' end-to-end tests.)
//!
//! - `harness`: one short iteration of the throughput harness.
//! - `scale`: the scale benches at a tenth of their size.
//!
//! Each module's tests take turns (`kubetun_testenv::turn`): side by side within a module,
//! never beside another module's, as when each was its own binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;
mod scale;

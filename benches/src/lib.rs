//! The iperf3 throughput harness: kubetun-gateway, wireguard-go and boringtun-cli carrying
//! the same tunnel between two network namespaces, plain veth as the ceiling, measured in one
//! interleaved run with CPU accounting and outside-load detection.
//!
//! - [`testbed`]: the namespaces, daemons and `wg setconf` configuration.
//! - [`harness`]: the measurement loop.
//! - [`model`]: the run configuration and the record of one run, shared by the loop and
//!   the report.
//! - [`stats`]: the median of the runs' numbers.
//! - [`cpu`]: CPU time of daemons, harness and everything else, from `/proc`.
//! - [`report`]: medians, ranges, ratios, the markdown section and the results file.
//! - the compared implementations and where their executables are:
//!   [`kubetun_fixtures::implementations`], shared with the interop tests.
//! - [`machine`]: what a result was measured on.
//! - [`interrupt`]: a clean stop on SIGINT/SIGTERM.
//! - [`scale`]: one gateway with many peers and one hub controller with many remote clusters
//!   (`kubetun-scale`).
//!
//! The criterion micro-benchmarks live in `benches/`.

pub mod cpu;
pub mod harness;
pub mod interrupt;
pub mod latency;
pub mod machine;
pub mod model;
pub mod report;
pub mod scale;
pub mod stats;
pub mod testbed;
pub mod udp_drops;

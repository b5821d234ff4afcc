//! Shared helpers of the kubetun benchmarks.

//! Summaries of the runs: per test and implementation the median goodput with min–max, the
//! daemons' CPU, retransmits or loss, and the kubetun ratios computed within the same run;
//! rendered as the `## Throughput (iperf3, netns)` section of `benches/RESULTS.md` and as
//! JSON.
//!
//! A cell with a disturbed run (outside load over the threshold even after retries) reports
//! no number: it says "disturbed".

mod markdown;
mod summary;
#[cfg(test)]
mod tests;

pub use markdown::{SECTION_HEADING, render_markdown, replace_section, update_results_file};
pub use summary::{BenchResults, Cell, Measured, Outcome, Ratio, Settings, summarise};

//! The ping train that measures each outage: `ping -D` every 20 ms, replies timestamped.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::HaError;
use kubetun_testenv::netns::command_in;

/// `ping -D` every 20 ms; the replies' timestamps, read as they come.
#[derive(Debug)]
pub struct PingTrain {
    child: Child,
    replies: Arc<Mutex<Vec<f64>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PingTrain {
    /// Pings `target` from `source` inside namespace `ns` every 20 ms (for at most 10 min).
    pub fn start(ns: &str, source: &str, target: &str) -> Result<Self, HaError> {
        let mut child = command_in(ns, "ping")
            .args([
                "-n", "-D", "-i", "0.02", "-W", "1", "-w", "600", "-I", source, target,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| HaError::Step("ping has no stdout".into()))?;
        let replies = Arc::new(Mutex::new(Vec::new()));
        let sink = replies.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(time) = reply_time(&line) {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(time);
                }
            }
        });
        Ok(Self {
            child,
            replies,
            reader: Some(reader),
        })
    }

    /// The longest time without a reply between `from` and `to` (Unix seconds), counting
    /// the edges of the window; `None` when no reply came after `from` at all.
    pub fn longest_gap(&self, from: f64, to: f64) -> Option<f64> {
        let replies = self.replies.lock().unwrap_or_else(PoisonError::into_inner);
        let last_before = replies.iter().rev().find(|t| **t <= from).copied();
        let within: Vec<f64> = replies
            .iter()
            .copied()
            .filter(|t| *t > from && *t <= to)
            .collect();
        within.first()?;
        let mut previous = last_before.unwrap_or(from);
        let mut longest: f64 = 0.0;
        for t in within {
            longest = longest.max(t - previous);
            previous = t;
        }
        Some(longest)
    }

    /// Replies received so far.
    pub fn replies(&self) -> usize {
        self.replies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for PingTrain {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Now, in Unix seconds (what `ping -D` prints).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The timestamp of a `ping -D` reply line: `[1732550000.123456] 64 bytes from ...`.
fn reply_time(line: &str) -> Option<f64> {
    if !line.contains("bytes from") {
        return None;
    }
    line.strip_prefix('[')?.split(']').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_are_parsed_and_the_rest_ignored() {
        assert_eq!(
            reply_time(
                "[1732550000.123456] 64 bytes from 10.1.3.10: icmp_seq=1 ttl=62 time=0.3 ms"
            ),
            Some(1_732_550_000.123_456)
        );
        assert_eq!(reply_time("PING 10.1.3.10 (10.1.3.10) from 10.2.0.1"), None);
        assert_eq!(
            reply_time("[1732550000.1] no answer yet for icmp_seq=3"),
            None
        );
    }
}

//! The cargo-fuzz targets' entry points (`gateway/fuzz/fuzz_targets/`), run on the stable
//! toolchain for a bounded time: the committed corpus, mutated (bit flips, byte changes,
//! truncation, duplication and splicing of entries, UAPI key lines inserted) by a seeded
//! generator. Not coverage-guided like libFuzzer, but it needs neither nightly nor
//! cargo-fuzz, so every test run (and CI) exercises the same oracles. The time per target is
//! `KUBETUN_FUZZ_SECONDS` (default 2, 20 under `CI=true`); the seed is printed so a failure
//! can be replayed with `KUBETUN_FUZZ_SEED`.

use std::path::Path;
use std::time::{Duration, Instant};

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn budget() -> Duration {
    let default = if std::env::var("CI").is_ok_and(|v| v == "true") {
        20
    } else {
        2
    };
    let seconds = std::env::var("KUBETUN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(seconds)
}

fn seed() -> u64 {
    std::env::var("KUBETUN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| crate::clock::unix_ms() | 1)
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut entries: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
        .map(|entry| std::fs::read(entry.expect("entry").path()).expect("corpus file"))
        .collect();
    entries.sort();
    assert!(entries.len() >= 5, "corpus {name} is too small");
    entries
}

/// One mutation of a corpus entry; `extras` are fragments worth splicing in.
fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], extras: &[&[u8]]) -> Vec<u8> {
    let mut data = corpus[rng.below(corpus.len())].clone();
    for _ in 0..=rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            2 => data.truncate(at),
            3 => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                data.splice(at..at, other[from..].iter().copied());
            }
            4 if !extras.is_empty() => {
                let extra = extras[rng.below(extras.len())];
                data.splice(at..at, extra.iter().copied());
            }
            5 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                let copy = data[at.min(end)..end].to_vec();
                data.splice(at..at, copy);
            }
            _ => data.insert(at, rng.next() as u8),
        }
    }
    data
}

fn run(name: &str, extras: &[&[u8]], check: impl Fn(&[u8])) {
    let corpus = corpus(name);
    let seed = seed();
    let mut rng = Rng(seed);
    let deadline = Instant::now() + budget();
    let mut runs = 0u64;
    for entry in &corpus {
        check(entry);
    }
    while Instant::now() < deadline {
        let input = mutate(&mut rng, &corpus, extras);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&input)));
        if let Err(panic) = outcome {
            eprintln!("{name}: failing input (seed {seed}): {input:?}");
            std::panic::resume_unwind(panic);
        }
        runs += 1;
    }
    println!("{name}: {runs} mutated inputs (seed {seed})");
    assert!(runs > 0, "the time budget allowed no run");
}

#[test]
fn uapi_target_survives_a_bounded_randomized_run() {
    let key = "ab".repeat(32);
    let lines = [
        format!("private_key={key}\n"),
        format!("public_key={key}\n"),
        format!("preshared_key={key}\n"),
        "allowed_ip=10.0.0.0/8\n".to_owned(),
        "allowed_ip=fd00::/64\n".to_owned(),
        "replace_allowed_ips=true\n".to_owned(),
        "replace_peers=true\n".to_owned(),
        "remove=true\n".to_owned(),
        "update_only=true\n".to_owned(),
        "endpoint=[::1]:1\n".to_owned(),
        "get=1\n".to_owned(),
        "set=1\n".to_owned(),
        "\r\n".to_owned(),
        "\n".to_owned(),
    ];
    let extras: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    run("uapi", &extras, crate::uapi::fuzz_check);
}

#[test]
fn remap_target_survives_a_bounded_randomized_run() {
    run("remap", &[], |data| {
        let _ = kubetun_remap::fuzz_check(data);
    });
}

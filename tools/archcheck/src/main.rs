//! `kubetun-archcheck`: the architecture gate over the workspace `cargo metadata` lists.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

fn main() -> anyhow::Result<ExitCode> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    let targets = kubetun_archcheck::targets(&String::from_utf8_lossy(&out.stdout))?;
    // Paths in the findings, relative to the workspace.
    let root = format!("{}/", std::env::current_dir()?.display());
    // `--outward`: which modules of the workspace's crates each package names, to write seams.
    let outward_only = std::env::args().any(|a| a == "--outward");
    let ours: BTreeSet<String> = targets.iter().map(|t| t.name.replace('-', "_")).collect();
    let mut named: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut failures = 0;
    for target in &targets {
        let findings = kubetun_archcheck::check(target)
            .with_context(|| format!("{} ({} {})", target.package, target.kind, target.name))?;
        let crate_name = target.package.replace('-', "_");
        for (_, path) in &findings.outward {
            if let [krate, module, ..] = path.as_slice()
                && ours.contains(krate)
                && *krate != target.package.replace('-', "_")
            {
                *named
                    .entry((target.package.clone(), format!("{krate}::{module}")))
                    .or_default() += 1;
            }
        }
        if outward_only {
            continue;
        }
        for cycle in &findings.cycles {
            failures += 1;
            let floor = if cycle.floor.is_empty() {
                "the crate root".to_string()
            } else {
                cycle.floor.join("::")
            };
            println!(
                "{} ({} {}): import cycle under {floor} among {}",
                target.package,
                target.kind,
                target.name,
                cycle.members.join(", ")
            );
            for (a, b, example) in &cycle.arrows {
                let example = example.replace(&root, "");
                println!("    {a} -> {b}: {example}");
            }
        }
        // Tests and benches may reach what they test; the seams bind the programs and libraries.
        let bound = target.kind == "lib" || target.kind == "bin";
        for (file, path) in findings.outward.iter().filter(|_| bound) {
            if let Some(rule) = kubetun_archcheck::seams::breaks(&crate_name, path) {
                failures += 1;
                let file = file.replace(&root, "");
                println!("{file} names {}: {rule}", path.join("::"));
            }
        }
    }
    if outward_only {
        for ((package, module), count) in named {
            println!("{package} -> {module} ({count})");
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} targets checked, {failures} findings", targets.len());
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

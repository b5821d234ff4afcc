//! The architecture gate: reads every workspace crate's module tree and fails on an import
//! cycle between modules (see [`cycles`] for the rule) or on a crate that names another
//! program's internals (see [`seams`]). `.ci/gates` runs it; it replaces prose claims about
//! who imports what with a check.

pub mod cycles;
pub mod error;
pub mod resolve;
pub mod seams;
pub mod tree;

use std::path::PathBuf;

use crate::error::Error;

/// One compilation target of a workspace package.
#[derive(Debug, Clone)]
pub struct Target {
    /// The package's name (`kubetun-controller`).
    pub package: String,
    /// `lib`, `bin`, `test`, `bench`, `example`.
    pub kind: String,
    /// The target's name.
    pub name: String,
    /// Its root file.
    pub root: PathBuf,
}

/// The targets `cargo metadata --no-deps --format-version 1` lists (build scripts left out).
pub fn targets(metadata: &str) -> Result<Vec<Target>, Error> {
    let json: serde_json::Value =
        serde_json::from_str(metadata).map_err(|e| Error::Metadata(e.to_string()))?;
    let packages = json["packages"]
        .as_array()
        .ok_or_else(|| Error::Metadata("no packages".into()))?;
    let mut out = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        for target in package["targets"].as_array().into_iter().flatten() {
            let kind = target["kind"][0].as_str().unwrap_or_default();
            let kind = match kind {
                "lib" | "rlib" | "proc-macro" => "lib",
                "bin" | "test" | "bench" | "example" => kind,
                _ => continue,
            };
            out.push(Target {
                package: name.to_string(),
                kind: kind.to_string(),
                name: target["name"].as_str().unwrap_or_default().to_string(),
                root: PathBuf::from(target["src_path"].as_str().unwrap_or_default()),
            });
        }
    }
    Ok(out)
}

/// What the gate found in one target.
#[derive(Debug)]
pub struct Findings {
    /// Its import cycles.
    pub cycles: Vec<cycles::Cycle>,
    /// The paths it names in other crates.
    pub outward: Vec<cycles::Outward>,
}

/// Reads one target and finds its cycles.
pub fn check(target: &Target) -> Result<Findings, Error> {
    let tree = tree::Tree::load(&target.root)?;
    let (cycles, outward) = cycles::analyse(&tree);
    Ok(Findings { cycles, outward })
}

#[cfg(test)]
mod tests;

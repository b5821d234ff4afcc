//! The kubetun image as the project builds it, without a registry: a base image made from
//! scratch with only the files the binaries load (`ldd`), the CA bundle, `ip` (the gateway sets
//! its TUN device's addresses and routes with it) and `wg`, then `deploy/Dockerfile` on that
//! base from the binaries of this build (`BASE=<base>`, `BINARIES=context`), with rootful
//! buildah and podman. [`save`] writes it as a docker-archive tarball that a node's containerd
//! imports. Everything made is removed by name when the [`Artifacts`] are dropped, unless kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The longest any single podman/buildah call may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);

/// The tools an image build needs on the host.
pub const TOOLS: [&str; 5] = ["podman", "buildah", "ldd", "strip", "timeout"];

/// Runs `program args` bounded by `timeout`; the output, or a message with stderr.
pub fn run_bounded(program: &str, args: &[&str], timeout: Duration) -> Result<Output, String> {
    let output = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(timeout.as_secs().to_string())
        .arg(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// [`run_bounded`] with [`COMMAND_TIMEOUT`]; its stdout, trimmed.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = run_bounded(program, args, COMMAND_TIMEOUT)?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Containers and images made by a build, removed by name on drop.
#[derive(Debug, Default)]
pub struct Artifacts {
    /// buildah working containers.
    pub containers: Vec<String>,
    /// Images, removed newest first.
    pub images: Vec<String>,
}

impl Artifacts {
    /// Keeps the images (the lab's, which `kubetun-lab down` removes); the working containers
    /// still go.
    pub fn keep_images(&mut self) -> Vec<String> {
        std::mem::take(&mut self.images)
    }
}

impl Drop for Artifacts {
    fn drop(&mut self) {
        let quick = Duration::from_secs(60);
        for container in &self.containers {
            let _ = run_bounded("buildah", &["rm", container], quick);
        }
        for image in self.images.iter().rev() {
            let _ = run_bounded("podman", &["rmi", "--force", image], quick);
        }
    }
}

/// The shared libraries and the loader `binary` needs, as `ldd` resolves them.
fn loaded_files(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = run("ldd", &[&binary.to_string_lossy()])?;
    Ok(out
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; "linux-vdso.so.1 (0x...)" has no file.
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Copies `from` (following links) to `root` + `to`.
fn stage(root: &Path, from: &Path, to: &Path) -> Result<(), String> {
    let dest = root.join(to.strip_prefix("/").unwrap_or(to));
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::copy(from, &dest).map_err(|e| format!("copy {}: {e}", from.display()))?;
    Ok(())
}

/// Makes the base image from scratch, like the Dockerfile's `runtime-base`: the loader and
/// libraries of `binaries`, `ip` and `wg`, the CA bundle. Returns its name.
pub fn build_base(
    made: &mut Artifacts,
    work: &Path,
    binaries: &[PathBuf],
    tag: &str,
) -> Result<String, String> {
    let root = work.join("base-rootfs");
    let mut files = Vec::new();
    for binary in binaries {
        files.extend(loaded_files(binary)?);
    }
    for tool in ["ip", "wg"] {
        let found = ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("`{tool}` is not installed on this host"))?;
        files.extend(loaded_files(&found)?);
        let real = std::fs::canonicalize(&found).map_err(|e| e.to_string())?;
        stage(&root, &real, &Path::new("/usr/bin").join(tool))?;
    }
    files.sort();
    files.dedup();
    for file in &files {
        let real = std::fs::canonicalize(file).map_err(|e| e.to_string())?;
        stage(&root, &real, file)?;
    }
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        stage(&root, ca, ca)?;
    }
    std::fs::create_dir_all(root.join("tmp")).map_err(|e| e.to_string())?;
    let container = run(
        "buildah",
        &["from", "--name", &format!("kubetun-base-{tag}"), "scratch"],
    )?;
    made.containers.push(container.clone());
    run(
        "buildah",
        &["copy", &container, &format!("{}/", root.display()), "/"],
    )?;
    let image = format!("localhost/kubetun-base:{tag}");
    run("buildah", &["commit", "--quiet", &container, &image])?;
    made.images.push(image.clone());
    Ok(image)
}

/// Builds `name` with `deploy/Dockerfile` from `binaries` (stripped) on `base`.
pub fn build_image(
    made: &mut Artifacts,
    work: &Path,
    binaries: &[PathBuf],
    base: &str,
    name: &str,
) -> Result<(), String> {
    let context = work.join("context");
    std::fs::create_dir_all(context.join("bin")).map_err(|e| e.to_string())?;
    for binary in binaries {
        let file = binary.file_name().ok_or("a binary without a file name")?;
        let dest = context.join("bin").join(file);
        // Debug builds carry hundreds of MB of debug info the image does not need.
        run(
            "strip",
            &["-o", &dest.to_string_lossy(), &binary.to_string_lossy()],
        )?;
    }
    let dockerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/Dockerfile");
    made.images.push(name.to_owned());
    run(
        "podman",
        &[
            "build",
            "--pull=never",
            "--layers=false",
            "-f",
            &dockerfile.to_string_lossy(),
            "--build-arg",
            &format!("BASE={base}"),
            "--build-arg",
            "BINARIES=context",
            "-t",
            name,
            &context.to_string_lossy(),
        ],
    )?;
    Ok(())
}

/// Writes `image` to `tar` as a docker archive (what `ctr images import` takes).
pub fn save(image: &str, tar: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(tar);
    run(
        "podman",
        &[
            "save",
            "--format",
            "docker-archive",
            "-o",
            &tar.to_string_lossy(),
            image,
        ],
    )?;
    Ok(())
}

//! The `kubetun` command line: subcommands and the pieces they share — kube clients from
//! `--kubeconfig`/`--context`, the `(local)`/`(remote)` progress printer, durations and
//! endpoints as flags, and plain-text tables.
//!
//! Its own crate so that only the CLI links what only it needs (the progress bars, the
//! embedded manifests); the connector, rotation and services code it drives lives in the
//! controller's core (`kubetun-controller`), which the ShortcutConnection operator shares.

pub mod cluster_args;
pub mod diagnose;
pub mod gateway;
pub mod install;
pub mod network;
pub mod output;
pub mod service;
pub mod service_diagnose;
pub mod shortcut;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use kubetun_crds::Endpoint;

use kubetun_controller::connector::{self, Progress};
pub use kubetun_controller::plumbing::kubeconfig::{
    KubeconfigError, KubeconfigSource, install_tls_provider,
};

/// A failure of a `kubetun` subcommand.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig cannot be read or has no usable context.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    /// The connector failed. Shown with its whole cause chain: this is the error the user
    /// reads, so it carries no separate source.
    #[error("{}", connector::error_chain(.0.as_ref()))]
    Connector(Box<connector::ConnectError>),
    /// An API call of the CLI itself failed (shown with the API error's cause chain).
    #[error("({cluster}) cannot {action}: {}", connector::error_chain(.error.as_ref()))]
    Api {
        /// Which cluster.
        cluster: String,
        /// What was attempted.
        action: String,
        /// The API error.
        error: Box<kube::Error>,
    },
    /// A flag value is unusable.
    #[error("{0}")]
    Usage(String),
    /// `kubetun diagnose` found a broken hop (the report names it and what to do).
    #[error("broken hop: {0}")]
    Broken(String),
    /// `-o json|yaml` could not be rendered.
    #[error(transparent)]
    Render(#[from] output::RenderError),
    /// A key rotation did not reach every peer (the report names them).
    #[error("{0}")]
    Incomplete(String),
    /// A key rotation failed.
    #[error("{}", connector::error_chain(.0.as_ref()))]
    Rotation(Box<kubetun_controller::connector::rotation::RotationError>),
    /// A wait ran out of time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The configured timeout.
        timeout: Duration,
    },
}

impl From<kubetun_controller::connector::rotation::RotationError> for Error {
    fn from(error: kubetun_controller::connector::rotation::RotationError) -> Self {
        Self::Rotation(Box::new(error))
    }
}

impl From<connector::ConnectError> for Error {
    fn from(error: connector::ConnectError) -> Self {
        Self::Connector(Box::new(error))
    }
}

/// Maps an API error of the cluster a command works on (`local`) to [`Error::Api`].
pub fn local_api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |error| Error::Api {
        cluster: "local".into(),
        action,
        error: Box::new(error),
    }
}

/// Kind of a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// A completed step or wait.
    Done,
    /// A wait begins.
    Waiting,
    /// A failed step or wait.
    Failed,
}

/// One progress line as printed (the spinner shows `Waiting` lines without the mark).
pub fn format_line(kind: LineKind, cluster: &str, message: &str) -> String {
    let mark = match kind {
        LineKind::Done => "✓",
        LineKind::Waiting => "…",
        LineKind::Failed => "✗",
    };
    format!("{mark} ({cluster}) {message}")
}

/// Prints connector progress: a spinner during waits on a terminal (steps completed
/// meanwhile print above it), plain lines otherwise.
#[derive(Debug)]
pub struct ConsoleProgress {
    interactive: bool,
    spinner: Mutex<Option<ProgressBar>>,
}

impl ConsoleProgress {
    /// Spinner when stdout is a terminal, plain lines otherwise.
    pub fn stdout() -> Self {
        Self {
            interactive: kubetun_controller::plumbing::logging::colour(&std::io::stdout()),
            spinner: Mutex::new(None),
        }
    }

    fn spinner(&self) -> std::sync::MutexGuard<'_, Option<ProgressBar>> {
        self.spinner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prints a line above the running spinner, or plainly.
    fn print_step(&self, line: &str) {
        match self.spinner().as_ref() {
            Some(spinner) => spinner.println(line),
            None => println!("{line}"),
        }
    }

    /// Stops the running spinner, then prints `line`.
    fn end_wait(&self, line: &str) {
        if let Some(spinner) = self.spinner().take() {
            spinner.finish_and_clear();
        }
        println!("{line}");
    }
}

impl Progress for ConsoleProgress {
    fn done(&self, cluster: &str, message: &str) {
        self.print_step(&format_line(LineKind::Done, cluster, message));
    }

    fn waiting(&self, cluster: &str, message: &str) {
        let mut spinner = self.spinner();
        if let Some(previous) = spinner.take() {
            previous.finish_and_clear();
        }
        if !self.interactive {
            println!("{}", format_line(LineKind::Waiting, cluster, message));
            return;
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(format!("({cluster}) {message}"));
        bar.enable_steady_tick(Duration::from_millis(120));
        *spinner = Some(bar);
    }

    fn waited(&self, cluster: &str, message: &str) {
        self.end_wait(&format_line(LineKind::Done, cluster, message));
    }

    fn failed(&self, cluster: &str, message: &str) {
        self.end_wait(&format_line(LineKind::Failed, cluster, message));
    }
}

/// Parses `90`, `90s`, `5m`, `1h`, `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 90s, 5m, 1h)"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(value)),
        "ms" => Ok(Duration::from_millis(value)),
        "m" => Ok(Duration::from_secs(value * 60)),
        "h" => Ok(Duration::from_secs(value * 3600)),
        other => Err(format!(
            "unknown duration unit {other:?} in {text:?} (use ms, s, m or h)"
        )),
    }
}

/// Parses `host:port` or `[ipv6]:port`.
pub fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    let invalid =
        || format!("{text:?} is not an endpoint (examples: 192.0.2.1:51820, [2001:db8::1]:51820)");
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => {
            let (host, port) = rest.split_once("]:").ok_or_else(invalid)?;
            (host, port)
        }
        None => {
            let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
            if host.contains(':') {
                return Err(invalid());
            }
            (host, port)
        }
    };
    let port: u16 = port.parse().map_err(|_| invalid())?;
    if host.is_empty() || port == 0 {
        return Err(invalid());
    }
    Ok(Endpoint {
        address: host.to_owned(),
        port,
    })
}

/// Appends `text` to `out` with every line indented by two spaces.
pub fn push_indented(out: &mut String, text: &str) {
    for line in text.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

/// Renders rows under headers with columns padded to their widest cell.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let mut text = padded.join("  ");
        text.truncate(text.trim_end().len());
        text.push('\n');
        text
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Human readable byte count (`1.5 KiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Makes a kubeconfig self-contained for use inside another cluster: keeps only `context`
/// (or the current context), its cluster and user, and inlines every referenced file
/// (`certificate-authority`, `client-certificate`, `client-key`, `tokenFile`) as data.
/// Relative paths resolve against `base_dir`.
pub fn minify_kubeconfig(
    yaml: &str,
    context: Option<&str>,
    base_dir: &Path,
    read_file: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<String, String> {
    use base64::Engine as _;
    use serde_yaml::Value;

    let mut doc: Value =
        serde_yaml::from_str(yaml).map_err(|e| format!("not a kubeconfig: {e}"))?;
    let context_name = match context {
        Some(name) => name.to_owned(),
        None => doc
            .get("current-context")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or("no --context given and the kubeconfig has no current-context")?
            .to_owned(),
    };
    let named = |doc: &Value, list: &str, name: &str| -> Option<Value> {
        doc.get(list)?
            .as_sequence()?
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some(name))
            .cloned()
    };
    let context_entry = named(&doc, "contexts", &context_name)
        .ok_or_else(|| format!("context {context_name:?} not found"))?;
    let field = |entry: &Value, key: &str| -> Option<String> {
        entry.get("context")?.get(key)?.as_str().map(str::to_owned)
    };
    let cluster_name = field(&context_entry, "cluster").ok_or("the context names no cluster")?;
    let mut cluster = named(&doc, "clusters", &cluster_name)
        .ok_or_else(|| format!("cluster {cluster_name:?} not found"))?;
    let user = match field(&context_entry, "user") {
        Some(user_name) => Some(
            named(&doc, "users", &user_name)
                .ok_or_else(|| format!("user {user_name:?} not found"))?,
        ),
        None => None,
    };

    let inline =
        |section: &mut Value, inner: &str, file_key: &str, data_key: &str, as_base64: bool| {
            let Some(map) = section.get_mut(inner).and_then(Value::as_mapping_mut) else {
                return Ok(());
            };
            let Some(path) = map.remove(file_key) else {
                return Ok(());
            };
            let path = path
                .as_str()
                .ok_or_else(|| format!("{file_key} is not a path"))?;
            let full = base_dir.join(path);
            let bytes =
                read_file(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))?;
            let value = if as_base64 {
                base64::engine::general_purpose::STANDARD.encode(bytes)
            } else {
                String::from_utf8(bytes)
                    .map_err(|_| format!("{} is not text", full.display()))?
                    .trim()
                    .to_owned()
            };
            map.insert(Value::from(data_key), Value::from(value));
            Ok::<(), String>(())
        };
    inline(
        &mut cluster,
        "cluster",
        "certificate-authority",
        "certificate-authority-data",
        true,
    )?;
    let mut users = Vec::new();
    if let Some(mut user) = user {
        inline(
            &mut user,
            "user",
            "client-certificate",
            "client-certificate-data",
            true,
        )?;
        inline(&mut user, "user", "client-key", "client-key-data", true)?;
        inline(&mut user, "user", "tokenFile", "token", false)?;
        users.push(user);
    }

    let mapping = doc
        .as_mapping_mut()
        .ok_or("not a kubeconfig: not a mapping")?;
    mapping.insert("clusters".into(), Value::Sequence(vec![cluster]));
    mapping.insert("users".into(), Value::Sequence(users));
    mapping.insert("contexts".into(), Value::Sequence(vec![context_entry]));
    mapping.insert("current-context".into(), Value::from(context_name));
    serde_yaml::to_string(&doc).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn endpoints_parse_ipv4_names_and_bracketed_ipv6() {
        let v4 = parse_endpoint("192.0.2.1:51820").unwrap();
        assert_eq!((v4.address.as_str(), v4.port), ("192.0.2.1", 51820));
        let v6 = parse_endpoint("[2001:db8::1]:443").unwrap();
        assert_eq!((v6.address.as_str(), v6.port), ("2001:db8::1", 443));
        assert_eq!(
            parse_endpoint("gw.example.org:1").unwrap().address,
            "gw.example.org"
        );
        assert!(parse_endpoint("2001:db8::1:443").is_err());
        assert!(parse_endpoint("host").is_err());
        assert!(parse_endpoint("host:0").is_err());
        assert!(parse_endpoint(":51820").is_err());
    }

    #[test]
    fn tables_pad_columns_to_the_widest_cell() {
        let table = render_table(
            &["PEER", "STATE"],
            &[
                vec!["milan".into(), "Connected".into()],
                vec!["a-long-peer".into(), "Error".into()],
            ],
        );
        assert_eq!(
            table,
            "PEER         STATE\nmilan        Connected\na-long-peer  Error\n"
        );
    }

    #[test]
    fn plain_lines_carry_mark_and_cluster() {
        assert_eq!(
            format_line(LineKind::Done, "local", "created x"),
            "✓ (local) created x"
        );
        assert_eq!(
            format_line(LineKind::Failed, "remote", "no"),
            "✗ (remote) no"
        );
        assert_eq!(
            format_line(LineKind::Waiting, "rome", "waiting"),
            "… (rome) waiting"
        );
    }

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 * 1024 * 1024), "3.0 MiB");
    }

    const KUBECONFIG: &str = r"
apiVersion: v1
kind: Config
current-context: rome
clusters:
- name: rome
  cluster:
    server: https://rome.example:6443
    certificate-authority: ca.crt
- name: milan
  cluster:
    server: https://milan.example:6443
contexts:
- name: rome
  context: {cluster: rome, user: rome-admin}
- name: milan
  context: {cluster: milan, user: milan-admin}
users:
- name: rome-admin
  user:
    client-certificate: /abs/rome.crt
    client-key-data: S0VZ
- name: milan-admin
  user:
    token: secret
";

    #[test]
    fn minified_kubeconfig_keeps_one_context_and_inlines_files() {
        let read = |path: &Path| -> std::io::Result<Vec<u8>> {
            match path.to_str() {
                Some("/home/me/.kube/ca.crt") => Ok(b"CA".to_vec()),
                Some("/abs/rome.crt") => Ok(b"CERT".to_vec()),
                _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
            }
        };
        let out = minify_kubeconfig(KUBECONFIG, None, Path::new("/home/me/.kube"), &read).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        assert_eq!(doc["clusters"].as_sequence().unwrap().len(), 1);
        assert_eq!(
            doc["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert!(
            doc["clusters"][0]["cluster"]
                .get("certificate-authority")
                .is_none()
        );
        assert_eq!(
            doc["users"][0]["user"]["client-certificate-data"],
            "Q0VSVA=="
        );
        assert_eq!(doc["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(doc["contexts"].as_sequence().unwrap().len(), 1);
        assert!(kube::config::Kubeconfig::from_yaml(&out).is_ok());

        let milan = minify_kubeconfig(KUBECONFIG, Some("milan"), Path::new("/"), &read).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&milan).unwrap();
        assert_eq!(doc["current-context"], "milan");
        assert_eq!(doc["users"][0]["user"]["token"], "secret");

        assert!(minify_kubeconfig(KUBECONFIG, Some("paris"), Path::new("/"), &read).is_err());
        let broken = KUBECONFIG.replace("/abs/rome.crt", "/missing.crt");
        let error =
            minify_kubeconfig(&broken, None, Path::new("/home/me/.kube"), &read).unwrap_err();
        assert!(error.contains("/missing.crt"), "{error}");
    }
}

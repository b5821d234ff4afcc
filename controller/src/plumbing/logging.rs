//! How the controller's programs log: the operator and the route agent to stdout (text,
//! coloured on a terminal, or JSON lines), the CLI to stderr and only when asked.

use tracing_subscriber::filter::LevelFilter;

use crate::log_filter;

/// Whether to write colour (ANSI escapes) to `stream`: only to a terminal, and never with
/// `NO_COLOR` set (<https://no-color.org>).
pub fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs to stdout, as text (coloured on a terminal) or JSON lines. A bare level in
/// RUST_LOG is kubetun's own; libraries log below WARN only when named
/// (`RUST_LOG=debug,kube_client=debug`), see [`log_filter`].
pub fn init_daemon(json: bool) {
    let (filter, problem) = log_filter::from_env("RUST_LOG", LevelFilter::INFO);
    if json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(colour(&std::io::stdout()))
            .init();
    }
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
}

/// Logs to stderr, only with `KUBETUN_LOG` set (failures reach the user as one `error: ...`
/// line instead). It is read like the daemons' RUST_LOG: a bare level is kubetun's own, a
/// library logs below WARN only when named (`KUBETUN_LOG=debug,kube_client=debug`).
pub fn init_cli() {
    let (filter, problem) = log_filter::from_env("KUBETUN_LOG", LevelFilter::OFF);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Some(problem) = problem {
        eprintln!("warning: {problem}");
    }
}

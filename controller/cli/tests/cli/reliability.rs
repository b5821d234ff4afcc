//! The `kubetun` binary refuses bad input with one clear line: usage errors (unknown
//! subcommands, missing or malformed arguments) exit 2 with clap's explanation, run-time
//! failures (unreadable or invalid state files, an unreachable gateway) exit 1 naming what
//! failed, each cause shown once; never a panic, never partial output on stdout.

use std::process::Command;

pub(crate) struct Outcome {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

pub(crate) fn kubetun(args: &[&str]) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_kubetun"))
        .args(args)
        .env_remove("KUBETUN_GATEWAY_SOCKET")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("run kubetun");
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `args`, checks the exit code and the common shape of a refusal, returns stderr.
pub(crate) fn refused(args: &[&str], code: i32) -> String {
    let out = kubetun(args);
    assert_eq!(out.code, Some(code), "kubetun {args:?}: {}", out.stderr);
    assert!(
        out.stdout.is_empty(),
        "kubetun {args:?} printed {}",
        out.stdout
    );
    assert!(
        out.stderr.starts_with("error: "),
        "kubetun {args:?}: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out.stderr
}

#[test]
fn usage_errors_exit_2_with_the_reason() {
    let stderr = refused(&["frobnicate"], 2);
    assert!(
        stderr.contains("unrecognized subcommand 'frobnicate'"),
        "{stderr}"
    );
    assert!(stderr.contains("Usage: kubetun"), "{stderr}");

    let stderr = refused(&["gateway", "apply"], 2);
    assert!(stderr.contains("--filename <FILE>"), "{stderr}");

    let stderr = refused(&["gateway", "show", "-o", "xml"], 2);
    assert!(stderr.contains("invalid value 'xml'"), "{stderr}");
    assert!(stderr.contains("table, json, yaml"), "{stderr}");

    let stderr = refused(&["network", "connect", "--timeout", "banana"], 2);
    assert!(stderr.contains("\"banana\" is not a duration"), "{stderr}");
}

#[test]
fn unreadable_and_invalid_state_files_are_named_with_the_cause_once() {
    let stderr = refused(&["gateway", "apply", "-f", "/nonexistent/state.yaml"], 1);
    assert!(
        stderr.contains("cannot read /nonexistent/state.yaml"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "the cause is shown once: {stderr}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.yaml");
    std::fs::write(&path, "peers: 12\n").expect("write");
    let path = path.to_str().expect("utf-8 path");
    let stderr = refused(&["gateway", "apply", "-f", path], 1);
    assert!(
        stderr.contains(&format!("{path} is not a valid gateway state")),
        "{stderr}"
    );
    assert!(stderr.contains("line 1 column 8"), "{stderr}");
}

#[test]
fn an_unreachable_gateway_is_reported_with_its_socket() {
    let stderr = refused(
        &["gateway", "--socket", "/nonexistent/gateway.sock", "show"],
        1,
    );
    assert!(
        stderr.contains("gateway at /nonexistent/gateway.sock is unavailable"),
        "{stderr}"
    );
}

#[test]
fn a_missing_kubeconfig_is_reported_before_anything_is_done() {
    let stderr = refused(&["network", "status"], 1);
    assert!(stderr.contains("kubeconfig"), "{stderr}");
}

//! `--isolation` on `install`, `network connect` and `shortcut create`: only `open` and
//! `exported` pass, anything else exits 2 naming the value and both choices before any
//! cluster is contacted; `--help` says what each means and what the default is.

use super::reliability::{kubetun, refused};

#[test]
fn a_bad_isolation_is_refused_with_the_two_choices() {
    let commands: [&[&str]; 3] = [
        &["install", "--cluster-id", "rome"],
        &["network", "connect", "--remote-context", "milan"],
        &[
            "shortcut",
            "create",
            "rome-milan",
            "--left-name",
            "rome",
            "--left-kubeconfig",
            "rome.yaml",
            "--right-name",
            "milan",
            "--right-kubeconfig",
            "milan.yaml",
        ],
    ];
    for command in commands {
        for bad in ["closed", "Exported", ""] {
            let mut args = command.to_vec();
            args.extend(["--isolation", bad]);
            let stderr = refused(&args, 2);
            assert!(
                stderr.contains(&format!("invalid value '{bad}' for '--isolation")),
                "{args:?}: {stderr}"
            );
            assert!(
                stderr.contains("expected `open` or `exported`"),
                "{args:?}: {stderr}"
            );
        }
    }
}

#[test]
fn the_help_names_the_default_of_each_command() {
    let help = |args: &[&str]| {
        let out = kubetun(args);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
        // clap wraps long help at the terminal width: compare words, not lines.
        out.stdout.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let install = help(&["install", "--help"]);
    for wanted in [
        "--isolation <open|exported>",
        "`exported` on a new install",
        "`open` on a cluster installed before the setting existed",
    ] {
        assert!(install.contains(wanted), "{wanted:?} not in: {install}");
    }
    let connect = help(&["network", "connect", "--help"]);
    for wanted in ["--isolation <open|exported>", "the cluster's default"] {
        assert!(connect.contains(wanted), "{wanted:?} not in: {connect}");
    }
    let shortcut = help(&["shortcut", "create", "--help"]);
    assert!(
        shortcut.contains("--isolation <open|exported>"),
        "{shortcut}"
    );
}

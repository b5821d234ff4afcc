use std::path::Path;

use crate::cycles::{Cycle, FILE};
use crate::{Target, check};

/// Writes `files` (path, text) under a temporary `src/` and checks the crate at `src/lib.rs`.
fn cycles_of(files: &[(&str, &str)]) -> Vec<Cycle> {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
    }
    let target = Target {
        package: "t".into(),
        kind: "lib".into(),
        name: "t".into(),
        root: dir.path().join("src/lib.rs"),
    };
    check(&target).expect("check").cycles
}

fn members(cycles: &[Cycle]) -> Vec<(String, Vec<String>)> {
    cycles
        .iter()
        .map(|c| (c.floor.join("::"), c.members.clone()))
        .collect()
}

#[test]
fn siblings_that_use_each_other_are_a_cycle() {
    let cycles = cycles_of(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b::B; pub struct A;"),
        ("b.rs", "pub struct B; fn f() { let _ = super::a::A; }"),
    ]);
    assert_eq!(
        members(&cycles),
        [(String::new(), vec!["a".into(), "b".into()])]
    );
}

#[test]
fn a_child_using_what_its_parent_file_defines_while_the_parent_uses_it_is_a_cycle() {
    let cycles = cycles_of(&[
        ("lib.rs", "mod lab;"),
        (
            "lab/mod.rs",
            "mod fabric; pub enum LabError {} fn f() { fabric::up(); }",
        ),
        ("lab/fabric.rs", "use crate::lab::LabError; pub fn up() {}"),
    ]);
    assert_eq!(
        members(&cycles),
        [("lab".into(), vec![FILE.to_string(), "fabric".into()])]
    );
}

#[test]
fn a_name_reached_through_a_re_export_lives_where_it_is_defined() {
    // lab/mod.rs re-exports LabError from its ground floor: fabric -> error, (file) -> error,
    // (file) -> fabric; no circle.
    let cycles = cycles_of(&[
        ("lib.rs", "mod lab;"),
        (
            "lab/mod.rs",
            "mod error; mod fabric; pub use error::LabError; fn f() { fabric::up(); }",
        ),
        ("lab/error.rs", "pub enum LabError {}"),
        ("lab/fabric.rs", "use super::LabError; pub fn up() {}"),
    ]);
    assert_eq!(members(&cycles), []);
}

#[test]
fn test_code_and_other_crates_draw_no_arrows() {
    let cycles = cycles_of(&[
        ("lib.rs", "mod a; mod b; #[cfg(test)] mod tests;"),
        (
            "a.rs",
            "use std::fmt; pub struct A; #[cfg(test)] fn t() { let _ = crate::b::B; }",
        ),
        ("b.rs", "use crate::a::A; pub struct B;"),
        ("tests.rs", "use crate::a::A; use crate::b::B;"),
    ]);
    assert_eq!(members(&cycles), []);
}

#[test]
fn globs_and_nested_floors_are_followed() {
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod net;"),
        ("net/mod.rs", "pub mod udp; pub mod tun;"),
        ("net/udp.rs", "use super::tun::*; pub struct Udp;"),
        (
            "net/tun.rs",
            "pub struct Tun; fn f() { let _ = crate::net::udp::Udp; }",
        ),
    ]);
    assert_eq!(
        members(&cycles),
        [("net".into(), vec!["tun".to_string(), "udp".into()])]
    );
}

#[test]
fn the_workspace_itself_parses() {
    // Every file of this crate, through the real loader (inline and file modules).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let target = Target {
        package: "kubetun-archcheck".into(),
        kind: "lib".into(),
        name: "kubetun_archcheck".into(),
        root,
    };
    let findings = check(&target).expect("check");
    assert_eq!(findings.cycles, []);
}

#[test]
fn a_program_s_internals_are_refused_to_other_crates_but_its_exceptions() {
    use crate::seams::breaks;
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert!(
        breaks(
            "kubetun_agent",
            &path("kubetun_controller::operator::ha::Standby")
        )
        .is_some()
    );
    assert!(
        breaks(
            "kubetun_controller",
            &path("kubetun_controller::operator::ha")
        )
        .is_none()
    );
    assert!(
        breaks(
            "kubetun_agent",
            &path("kubetun_controller::plumbing::runtime")
        )
        .is_none()
    );
    assert!(
        breaks(
            "kubetun_lab",
            &path("kubetun_controller::operator::services::offer")
        )
        .is_none()
    );
    assert!(breaks("kubetun_lab", &path("kubetun_controller::operator::ha")).is_some());
    assert!(breaks("kubetun_lab", &path("kubetun_cli::install::manifests")).is_none());
    assert!(breaks("kubetun_controller", &path("kubetun_cli::install")).is_some());
}

//! Replays the committed state-file fuzz corpus (`controller/cli/fuzz/corpus/state_file`) through
//! the fuzz oracle in the normal test suite, so every input that ever mattered stays covered
//! without a nightly toolchain.

#[path = "../../fuzz/oracle.rs"]
mod oracle;

use std::path::Path;

#[test]
fn committed_state_file_corpus_replays_cleanly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/state_file");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()));
    let mut replayed = 0;
    for entry in entries {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| oracle::check(&data)) {
            std::panic::resume_unwind(Box::new(format!(
                "{}: {}",
                path.display(),
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("panic")
            )));
        }
        replayed += 1;
    }
    assert!(
        replayed >= 15,
        "expected the seeded corpus, found {replayed} files"
    );
}

#[test]
fn oracle_accepts_a_valid_state_and_refuses_garbage_with_the_file_name() {
    oracle::check(b"peers: []\n");
    oracle::check(b"\x00\x01\x02");
    oracle::check(b"interface: [");
}

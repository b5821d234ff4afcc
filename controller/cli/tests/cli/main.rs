//! The `kubetun` CLI, one test binary: its answers to bad input (`reliability`, and the
//! `--isolation` flags in `isolation_flags`) and the state-file fuzz corpus replayed through
//! the fuzz oracle (`state_file`).

mod isolation_flags;
mod reliability;
mod state_file;

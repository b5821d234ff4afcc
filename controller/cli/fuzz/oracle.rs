//! The state-file oracle, shared by the fuzz target (`fuzz_targets/state_file.rs`) and the
//! stable replay of the committed corpus (`controller/cli/tests/cli/state_file.rs`).
//!
//! It panics when `kubetun gateway apply -f` would misbehave on the input: the parser panics,
//! a refusal does not name the file, an accepted state has no version, the gateway cannot
//! decode what the CLI would send or panics converting and validating it, or the state does
//! not survive being rendered as YAML and parsed again.

use kubetun_cli::gateway::parse_state;
use prost::Message as _;

/// Runs one input through the parser and everything downstream of it.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let state = match parse_state("input.yaml", &text) {
        Ok(state) => state,
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.starts_with("input.yaml is not a valid gateway state"),
                "a refusal must name the file: {message}"
            );
            return;
        }
    };
    assert!(
        !state.version.is_empty(),
        "an accepted state always carries a version"
    );

    let wire = state.encode_to_vec();
    let decoded = kubetun_gateway::proto::DesiredState::decode(wire.as_slice())
        .expect("the gateway decodes what the CLI sends");
    let current = kubetun_gateway::state::DesiredState::default();
    if let Ok(desired) = kubetun_gateway::state::from_proto(decoded, &current) {
        // Accepted or refused with a message, never a panic.
        let _verdict = desired.validate();
    }

    let rendered = serde_yaml::to_string(&state).expect("an accepted state renders as YAML");
    let reparsed = parse_state("rendered.yaml", &rendered)
        .unwrap_or_else(|e| panic!("a rendered state parses again: {e}\n{rendered}"));
    assert_eq!(reparsed, state, "rendering and parsing changed the state");
}

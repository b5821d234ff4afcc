//! The log filter of every kubetun program, built from `RUST_LOG` (the `kubetun` CLI:
//! `KUBETUN_LOG`). The gateway, the controller, the route agent and the CLI all call it, so
//! they read a filter the same way.
//!
//! A bare level sets kubetun's own level, not the libraries':
//!
//! - a bare level (`info`, `debug`, `RUST_LOG=debug`) applies to kubetun's own targets (every
//!   target starting with `kubetun`: `kubetun_controller`, `kubetun_gateway`, `kubetun_crds`);
//!   without one, the program's default applies (`info`; the CLI: `off`);
//! - libraries (kube, hyper, h2, tower, rustls, tonic, ...) log at WARN and above, or less
//!   when the bare level is quieter (`error`, `off`); two log less still, because the
//!   controller reports an outage itself (one line when the API server goes, one when it is
//!   back: `ApiHealth` in controller/src/runtime.rs): `kube_client::client::builder` (an ERROR line for every failed
//!   request, over 10 lines/s while an API server is away) is off and
//!   `kube_runtime::watcher` (a WARN for every 403 while a restarting API server fills its
//!   RBAC caches) logs errors only;
//! - a library logs more only when its target is named: `RUST_LOG=debug,kube_client=debug`.
//!   Naming a target (or a prefix of one, as EnvFilter matches targets) also lifts the
//!   defaults below it, so `kube_client=debug` brings `kube_client::client::builder` back;
//! - every other directive (`kubetun_controller::ha=trace`, span and field filters) is
//!   EnvFilter's own syntax and passes through unchanged, after the defaults, so it wins;
//! - a value EnvFilter refuses is reported in one line and the default used instead.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

/// The prefix of every target of kubetun's own crates (EnvFilter matches targets by prefix).
pub const OWN_TARGET: &str = "kubetun";

/// The most a library logs unless named.
pub const LIBRARY_LEVEL: LevelFilter = LevelFilter::WARN;

/// Library targets quieter than [`LIBRARY_LEVEL`] unless named.
pub const QUIETER_LIBRARIES: &[(&str, LevelFilter)] = &[
    // Every failed HTTP request at ERROR; the controller says once that the API server is
    // away and once that it is back, and reports the failures that matter itself.
    ("kube_client::client::builder", LevelFilter::OFF),
    // Every watch error at WARN, 403s included (a restarting API server refuses until its
    // RBAC caches are filled); the controller's watches report their errors to ApiHealth.
    ("kube_runtime::watcher", LevelFilter::ERROR),
];

/// The EnvFilter directives `spec` (a `RUST_LOG` value) means under the policy of this
/// module; `default` is kubetun's level when `spec` has no bare level.
pub fn directives(spec: &str, default: LevelFilter) -> String {
    let mut own = default;
    let mut named: Vec<&str> = Vec::new();
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match directive.parse::<LevelFilter>() {
            Ok(level) => own = level,
            Err(_) => named.push(directive),
        }
    }
    let library = own.min(LIBRARY_LEVEL);
    let named_targets: Vec<&str> = named.iter().filter_map(|d| target_of(d)).collect();
    let mut out = vec![library.to_string(), format!("{OWN_TARGET}={own}")];
    for (target, level) in QUIETER_LIBRARIES {
        if !named_targets.iter().any(|named| target.starts_with(named)) {
            out.push(format!("{target}={}", (*level).min(library)));
        }
    }
    out.extend(named.iter().map(|d| (*d).to_owned()));
    out.join(",")
}

/// The target a directive names (`target[span{field}]=level`), if any.
fn target_of(directive: &str) -> Option<&str> {
    let end = directive.find(['[', '=']).unwrap_or(directive.len());
    let target = directive[..end].trim();
    (!target.is_empty()).then_some(target)
}

/// The filter from the environment variable `var` under the policy of this module (unset or
/// empty: `default` for kubetun, the quiet library defaults). A value EnvFilter refuses
/// gives the default filter and a message saying so, to be logged once logging is set up.
pub fn from_env(var: &str, default: LevelFilter) -> (EnvFilter, Option<String>) {
    match std::env::var(var) {
        Ok(spec) => parse(var, &spec, default),
        Err(std::env::VarError::NotPresent) => (parse(var, "", default).0, None),
        Err(std::env::VarError::NotUnicode(_)) => (
            parse(var, "", default).0,
            Some(format!("{var} is not UTF-8; logging at the default level")),
        ),
    }
}

/// [`from_env`] for the value `spec` of `var`.
fn parse(var: &str, spec: &str, default: LevelFilter) -> (EnvFilter, Option<String>) {
    match EnvFilter::builder().parse(directives(spec, default)) {
        Ok(filter) => (filter, None),
        Err(error) => (
            EnvFilter::builder()
                .parse(directives("", default))
                .expect("the default directives parse"),
            Some(format!(
                "{var}={spec:?} is not a log filter ({error}); logging at the default level"
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_level_is_kubetuns_and_libraries_stay_at_warn() {
        assert_eq!(
            directives("info", LevelFilter::INFO),
            "warn,kubetun=info,kube_client::client::builder=off,kube_runtime::watcher=error"
        );
        assert_eq!(
            directives("", LevelFilter::INFO),
            directives("info", LevelFilter::INFO),
            "unset is the deployed info"
        );
        assert_eq!(
            directives("DEBUG", LevelFilter::INFO),
            "warn,kubetun=debug,kube_client::client::builder=off,kube_runtime::watcher=error"
        );
    }

    #[test]
    fn a_quieter_bare_level_quiets_the_libraries_too() {
        assert_eq!(
            directives("error", LevelFilter::INFO),
            "error,kubetun=error,kube_client::client::builder=off,kube_runtime::watcher=error"
        );
        assert_eq!(
            directives("off", LevelFilter::INFO),
            "off,kubetun=off,kube_client::client::builder=off,kube_runtime::watcher=off"
        );
        assert_eq!(
            directives("", LevelFilter::OFF),
            "off,kubetun=off,kube_client::client::builder=off,kube_runtime::watcher=off"
        );
    }

    #[test]
    fn a_named_target_opts_in_and_lifts_the_defaults_below_it() {
        assert_eq!(
            directives("debug,kube_client=debug", LevelFilter::INFO),
            "warn,kubetun=debug,kube_runtime::watcher=error,kube_client=debug"
        );
        assert_eq!(
            directives("kube=trace", LevelFilter::INFO),
            "warn,kubetun=info,kube=trace"
        );
        assert_eq!(
            directives(
                "info,kubetun_controller::ha=trace,[reconcile]=debug",
                LevelFilter::INFO
            ),
            "warn,kubetun=info,kube_client::client::builder=off,kube_runtime::watcher=error,\
             kubetun_controller::ha=trace,[reconcile]=debug"
        );
    }

    /// Which of `events` (target, level) a filter built from `spec` lets through.
    fn passes(spec: &str, events: &[(&str, tracing::Level)]) -> Vec<bool> {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;

        #[derive(Clone, Default)]
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let meta = event.metadata();
                self.0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(format!("{} {}", meta.target(), meta.level()));
            }
        }

        let filter = EnvFilter::builder()
            .parse(directives(spec, LevelFilter::INFO))
            .expect("parses");
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            // Events need static targets: one callsite per (target, level) used below.
            macro_rules! emit {
                ($target:literal) => {
                    tracing::trace!(target: $target, "x");
                    tracing::debug!(target: $target, "x");
                    tracing::info!(target: $target, "x");
                    tracing::warn!(target: $target, "x");
                    tracing::error!(target: $target, "x");
                };
            }
            emit!("kubetun_controller::runtime");
            emit!("kube_client::client::builder");
            emit!("kube_runtime::watcher");
            emit!("hyper_util::client");
            emit!("h2::codec");
        });
        let seen = seen
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        events
            .iter()
            .map(|(target, level)| seen.contains(&format!("{target} {level}")))
            .collect()
    }

    #[test]
    fn the_filter_does_what_the_directives_say() {
        use tracing::Level;
        let events = [
            ("kubetun_controller::runtime", Level::DEBUG),
            ("kubetun_controller::runtime", Level::INFO),
            ("kube_client::client::builder", Level::ERROR),
            ("kube_client::client::builder", Level::DEBUG),
            ("kube_runtime::watcher", Level::WARN),
            ("kube_runtime::watcher", Level::ERROR),
            ("hyper_util::client", Level::DEBUG),
            ("hyper_util::client", Level::WARN),
            ("h2::codec", Level::INFO),
        ];
        assert_eq!(
            passes("info", &events),
            [false, true, false, false, false, true, false, true, false]
        );
        assert_eq!(
            passes("debug", &events),
            [true, true, false, false, false, true, false, true, false],
            "a bare debug is kubetun's own: libraries stay quiet"
        );
        assert_eq!(
            passes("debug,kube_client=debug", &events),
            [true, true, true, true, false, true, false, true, false],
            "kube_client by name"
        );
        assert_eq!(
            passes("info,hyper_util=debug,h2=info", &events),
            [false, true, false, false, false, true, true, true, true]
        );
    }

    #[test]
    fn an_invalid_value_is_reported_and_the_default_used() {
        let (filter, problem) = parse("RUST_LOG", "info,kube_client=loud", LevelFilter::INFO);
        let problem = problem.expect("reported");
        assert!(
            problem.contains("RUST_LOG") && problem.contains("kube_client=loud"),
            "{problem}"
        );
        assert_eq!(
            filter.to_string(),
            parse("RUST_LOG", "", LevelFilter::INFO).0.to_string()
        );
        assert!(parse("RUST_LOG", "debug", LevelFilter::INFO).1.is_none());
        assert!(
            from_env("KUBETUN_LOG_FILTER_TEST_UNSET", LevelFilter::INFO)
                .1
                .is_none(),
            "unset is not a problem"
        );
    }
}

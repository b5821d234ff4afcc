//! Which parts of a program's crate other crates may not name: a program's internals stay its
//! own, and what another crate needs from it is a seam (the contract in `kubetun-crds` and
//! `kubetun-gateway-api`, the pure cores, plumbing, the connector).
//!
//! Tests and benches are not bound: they may reach what they test.

/// An internal part of a program: the path prefix, and the crates that may still name a
/// narrower prefix of it, each with the reason.
#[derive(Debug)]
pub struct Internal {
    /// `kubetun_controller::operator`: everything under it.
    pub prefix: &'static str,
    /// `(crate, narrower prefix it may name, why)`.
    pub except: &'static [(&'static str, &'static str, &'static str)],
}

/// The programs' internals.
pub const INTERNAL: &[Internal] = &[
    Internal {
        prefix: "kubetun_controller::operator",
        except: &[(
            "kubetun_lab",
            "kubetun_controller::operator::services",
            "the lab without API servers runs the services' pure planning (offer, desired \
             imports, the DNS table) and the DNS server in process",
        )],
    },
    Internal {
        prefix: "kubetun_agent::daemon",
        except: &[],
    },
    Internal {
        prefix: "kubetun_gateway::device",
        except: &[],
    },
    Internal {
        prefix: "kubetun_gateway::grpc",
        except: &[],
    },
    Internal {
        prefix: "kubetun_gateway::uapi",
        except: &[],
    },
    Internal {
        prefix: "kubetun_cli",
        except: &[(
            "kubetun_lab",
            "kubetun_cli::install",
            "the lab installs kubetun's manifests composed exactly as `kubetun install` does",
        )],
    },
];

/// The rule a path breaks, if any: crate `from` names `path` (`[crate, module, ...]`).
pub fn breaks(from: &str, path: &[String]) -> Option<String> {
    let joined = path.join("::");
    let within = |prefix: &str| joined == prefix || joined.starts_with(&format!("{prefix}::"));
    INTERNAL.iter().find_map(|rule| {
        let owner = rule.prefix.split("::").next()?;
        if from == owner || !within(rule.prefix) {
            return None;
        }
        let excepted = rule
            .except
            .iter()
            .any(|(krate, narrower, _)| *krate == from && within(narrower));
        (!excepted).then(|| format!("`{}` is internal to {owner}", rule.prefix))
    })
}

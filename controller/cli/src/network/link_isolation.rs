//! Each side's isolation on `network connect`: the flag, else what the link's NetworkConfigs
//! say (a re-run without the flag changes nothing), else the side's cluster default; read
//! from both clusters and printed before the connector writes it.

use kube::Api;
use kubetun_crds::{Isolation, NetworkConfig};

use crate::Error;
use kubetun_controller::connector::Connector;
use kubetun_controller::planner::local_config_name;

/// Where a side's isolation towards the peer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationSource {
    /// `--isolation`.
    Flag,
    /// The side's NetworkConfig of the existing link says it.
    Link,
    /// Left out: the side's cluster default.
    ClusterDefault,
}

/// Each side's isolation on `connect` (`[local, remote]`): the flag, else what each side's
/// NetworkConfig of the link says (a re-run without the flag changes nothing), else left
/// out (the cluster's default). `existing[i]` is `None` without a NetworkConfig.
pub fn plan_isolation(
    flag: Option<Isolation>,
    existing: [Option<Option<Isolation>>; 2],
) -> [(Option<Isolation>, IsolationSource); 2] {
    existing.map(|existing| match (flag, existing.flatten()) {
        (Some(given), _) => (Some(given), IsolationSource::Flag),
        (None, Some(kept)) => (Some(kept), IsolationSource::Link),
        (None, None) => (None, IsolationSource::ClusterDefault),
    })
}

/// The line `connect` prints for one side's isolation.
pub fn describe_isolation(
    side: &str,
    peer: &str,
    (isolation, source): (Option<Isolation>, IsolationSource),
) -> String {
    match (isolation, source) {
        (Some(isolation), IsolationSource::Flag) => {
            format!("isolation of {side} towards {peer}: {isolation} (--isolation)")
        }
        (Some(isolation), _) => format!(
            "isolation of {side} towards {peer}: {isolation} (the link's; --isolation changes it)"
        ),
        (None, _) => format!(
            "isolation of {side} towards {peer}: {side}'s cluster default (KUBETUN_ISOLATION; \
             --isolation sets the link's own)"
        ),
    }
}

/// Reads what each side's NetworkConfig of the link says about isolation, plans the
/// isolation of both sides ([`plan_isolation`]) and prints it.
pub(super) async fn link_isolation(
    connector: &Connector,
    flag: Option<Isolation>,
) -> Result<[Option<Isolation>; 2], Error> {
    let (local, remote) = connector.load_infos().await?;
    let mut existing = [None, None];
    for (slot, (handle, own, peer)) in existing.iter_mut().zip([
        (connector.local(), &local, &remote),
        (connector.remote(), &remote, &local),
    ]) {
        let name = local_config_name(&peer.cluster.id);
        let config = Api::<NetworkConfig>::namespaced(handle.client.clone(), &handle.namespace)
            .get_opt(&name)
            .await
            .map_err(|error| Error::Api {
                cluster: handle.label.clone(),
                action: format!(
                    "read NetworkConfig {}/{name} of cluster {}",
                    handle.namespace, own.cluster.id
                ),
                error: Box::new(error),
            })?;
        *slot = config.map(|c| c.spec.isolation);
    }
    let plan = plan_isolation(flag, existing);
    println!(
        "{}",
        describe_isolation(&local.cluster.id, &remote.cluster.id, plan[0])
    );
    println!(
        "{}",
        describe_isolation(&remote.cluster.id, &local.cluster.id, plan[1])
    );
    Ok(plan.map(|(isolation, _)| isolation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_sets_both_sides_and_its_absence_keeps_the_link() {
        use IsolationSource::{ClusterDefault, Flag, Link};
        let (open, exported) = (Some(Isolation::Open), Some(Isolation::Exported));
        // A new link: the flag on both sides, or each cluster's default.
        assert_eq!(
            plan_isolation(exported, [None, None]),
            [(exported, Flag), (exported, Flag)]
        );
        assert_eq!(
            plan_isolation(None, [None, None]),
            [(None, ClusterDefault), (None, ClusterDefault)]
        );
        // An existing link: the flag changes both sides; without it each side keeps its
        // own, and a side that left it out stays on its cluster default.
        assert_eq!(
            plan_isolation(open, [Some(exported), Some(None)]),
            [(open, Flag), (open, Flag)]
        );
        assert_eq!(
            plan_isolation(None, [Some(open), Some(None)]),
            [(open, Link), (None, ClusterDefault)]
        );
        let lines: Vec<String> = plan_isolation(None, [Some(open), Some(None)])
            .into_iter()
            .zip([("rome", "milan"), ("milan", "rome")])
            .map(|(plan, (side, peer))| describe_isolation(side, peer, plan))
            .collect();
        assert_eq!(
            lines[0],
            "isolation of rome towards milan: open (the link's; --isolation changes it)"
        );
        assert!(
            lines[1].starts_with("isolation of milan towards rome: milan's cluster default"),
            "{}",
            lines[1]
        );
        assert_eq!(
            describe_isolation("rome", "milan", (exported, Flag)),
            "isolation of rome towards milan: exported (--isolation)"
        );
    }
}

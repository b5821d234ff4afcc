//! The pure reconciliation step: the kernel state tagged as the agent's (observed) against the
//! desired state gives the ordered list of changes that makes the first equal the second.
//!
//! Order matters for traffic: stale rules go first (nothing is steered into a table being
//! emptied), then stale routes, then the overlay device, then routes, then rules last (a rule
//! only ever points at a table that already holds its route). Recreating the overlay device
//! drops every route through it in the kernel, so those are planned again.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};

use super::plan::{DesiredState, LinkIdentity, OverlayLink, Route, RuleSelector};

/// The overlay device as found in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedLink {
    /// Creation-time attributes.
    pub identity: LinkIdentity,
    /// Device MTU.
    pub mtu: u32,
    /// Administratively up.
    pub up: bool,
    /// IPv4 addresses on the device.
    pub addresses: BTreeSet<Ipv4Net>,
    /// All-zero FDB entries (flood destinations).
    pub flood_to: BTreeSet<Ipv4Addr>,
}

/// Everything in the kernel that carries the agent's tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedState {
    /// The device named like the overlay, if any.
    pub overlay: Option<ObservedLink>,
    /// Routes of the agent's table with the agent's protocol.
    pub routes: Vec<Route>,
    /// Rules at the agent's priority pointing at its table.
    pub rules: Vec<RuleSelector>,
}

impl ObservedState {
    /// True when nothing of the agent is left.
    pub fn is_empty(&self) -> bool {
        self.overlay.is_none() && self.routes.is_empty() && self.rules.is_empty()
    }
}

/// One kernel operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Delete a policy rule.
    DeleteRule(RuleSelector),
    /// Delete a route of the agent's table.
    DeleteRoute(Route),
    /// Delete the overlay device (and with it its addresses, FDB entries and routes).
    DeleteLink,
    /// Create the overlay device (down, without addresses).
    CreateLink(OverlayLink),
    /// Set the overlay device's MTU.
    SetLinkMtu(u32),
    /// Remove an address from the overlay device.
    DeleteAddress(Ipv4Net),
    /// Add an address to the overlay device.
    AddAddress(Ipv4Net),
    /// Remove a flood destination.
    DeleteFlood(Ipv4Addr),
    /// Add a flood destination.
    AddFlood(Ipv4Addr),
    /// Bring the overlay device up.
    SetLinkUp,
    /// Create or replace the route to this destination.
    PutRoute(Route),
    /// Add a policy rule.
    AddRule(RuleSelector),
}

/// The changes that turn `observed` into `desired`; empty when they already agree.
pub fn diff(observed: &ObservedState, desired: &DesiredState) -> Vec<Change> {
    let mut changes = Vec::new();

    let desired_rules = &desired.rules;
    let mut seen_rules = BTreeSet::new();
    for rule in &observed.rules {
        if !desired_rules.contains(rule) || !seen_rules.insert(*rule) {
            changes.push(Change::DeleteRule(*rule));
        }
    }

    let recreate = match (&observed.overlay, &desired.overlay) {
        (Some(have), Some(want)) => have.identity != want.identity(),
        _ => false,
    };
    let surviving_routes: Vec<&Route> = observed
        .routes
        .iter()
        .filter(|route| !(recreate && route.via_overlay))
        .collect();
    // A destination is claimed by the first observed route to it: kept when it is exactly the
    // desired one, replaced in place by `PutRoute` otherwise. Any further route to the same
    // destination, and any route to an undesired one, is deleted.
    let mut claimed: BTreeSet<IpNet> = BTreeSet::new();
    let mut kept: BTreeSet<IpNet> = BTreeSet::new();
    for route in surviving_routes {
        let Some(wanted) = desired.routes.get(&route.destination) else {
            changes.push(Change::DeleteRoute(route.clone()));
            continue;
        };
        if !claimed.insert(route.destination) {
            changes.push(Change::DeleteRoute(route.clone()));
        } else if wanted == route {
            kept.insert(route.destination);
        }
    }

    link_changes(
        observed.overlay.as_ref(),
        desired.overlay.as_ref(),
        recreate,
        &mut changes,
    );

    for (destination, route) in &desired.routes {
        if !kept.contains(destination) {
            changes.push(Change::PutRoute(route.clone()));
        }
    }
    let observed_rules: BTreeSet<&RuleSelector> = observed.rules.iter().collect();
    for rule in desired_rules {
        if !observed_rules.contains(rule) {
            changes.push(Change::AddRule(*rule));
        }
    }
    changes
}

fn link_changes(
    have: Option<&ObservedLink>,
    want: Option<&OverlayLink>,
    recreate: bool,
    changes: &mut Vec<Change>,
) {
    let Some(want) = want else {
        if have.is_some() {
            changes.push(Change::DeleteLink);
        }
        return;
    };
    let have = match have {
        Some(have) if !recreate => have.clone(),
        _ => {
            if recreate {
                changes.push(Change::DeleteLink);
            }
            changes.push(Change::CreateLink(want.clone()));
            ObservedLink {
                identity: want.identity(),
                mtu: want.mtu,
                up: false,
                addresses: BTreeSet::new(),
                flood_to: BTreeSet::new(),
            }
        }
    };
    if have.mtu != want.mtu {
        changes.push(Change::SetLinkMtu(want.mtu));
    }
    let want_addresses = BTreeSet::from([want.address]);
    changes.extend(
        have.addresses
            .difference(&want_addresses)
            .map(|a| Change::DeleteAddress(*a)),
    );
    changes.extend(
        want_addresses
            .difference(&have.addresses)
            .map(|a| Change::AddAddress(*a)),
    );
    changes.extend(
        have.flood_to
            .difference(&want.flood_to)
            .map(|ip| Change::DeleteFlood(*ip)),
    );
    changes.extend(
        want.flood_to
            .difference(&have.flood_to)
            .map(|ip| Change::AddFlood(*ip)),
    );
    if !have.up {
        changes.push(Change::SetLinkUp);
    }
}

/// The changes that remove everything of the agent (`agent --cleanup`).
pub fn teardown(observed: &ObservedState) -> Vec<Change> {
    diff(observed, &DesiredState::default())
}

#[cfg(test)]
mod tests;

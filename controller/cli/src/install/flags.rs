//! The settings of `kubetun install` that a re-run keeps: every flag given is recorded on the
//! controller's ConfigMap (annotation `net.kubetun.io/install-settings`, JSON), and a re-run
//! without that flag uses the recorded value, so `kubetun install --image …` on a hub stays a
//! hub with replicated gateways. Nothing secret is among them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use kubetun_controller::plumbing::cluster_info::{Cidrs, parse_cidrs};

/// ConfigMap annotation holding the recorded [`Settings`].
pub const SETTINGS_ANNOTATION: &str = "net.kubetun.io/install-settings";

/// The settings flags of an install; `None`: not given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_forwarding: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ha: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<Cidrs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_cidr: Option<Cidrs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_cidr: Option<Cidrs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Cidrs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_node_selector: Option<NodeSelector>,
}

impl Settings {
    /// The flags given, else the recorded ones; and the names of those taken from the record.
    pub fn or_recorded(self, recorded: &Self) -> (Self, Vec<&'static str>) {
        let mut kept = Vec::new();
        macro_rules! pick {
            ($($field:ident => $flag:literal),* $(,)?) => {
                Self { $($field: match self.$field {
                    Some(given) => Some(given),
                    None => {
                        if recorded.$field.is_some() {
                            kept.push($flag);
                        }
                        recorded.$field.clone()
                    }
                }),* }
            };
        }
        let merged = pick!(
            cluster_name => "--cluster-name",
            hub => "--hub",
            hub_forwarding => "--hub-forwarding",
            ha => "--ha",
            endpoint_address => "--endpoint-address",
            endpoint_port => "--endpoint-port",
            pod_cidr => "--pod-cidr",
            service_cidr => "--service-cidr",
            external_cidr => "--external-cidr",
            reserved => "--reserved",
            image => "--image",
            gateway_node_selector => "--gateway-node-selector",
        );
        (merged, kept)
    }

    /// The record as stored in the annotation.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A record read back (an unreadable one counts as none).
    pub fn from_json(text: Option<&String>) -> Self {
        text.and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    }
}

/// `--gateway-node-selector`: the labels a node must have to run the gateway pod (the
/// pod template's `nodeSelector`); `""` is the empty selector (to clear a recorded one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeSelector(pub BTreeMap<String, String>);

impl NodeSelector {
    /// `KEY=VALUE,…`, as given on the command line (and as a label selector reads it).
    pub fn to_flag(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Parses `--gateway-node-selector KEY=VALUE[,KEY=VALUE…]`: each key a Kubernetes label key,
/// each value a label value (may be empty); the error names the bad entry.
pub fn parse_node_selector(text: &str) -> Result<NodeSelector, String> {
    let mut selector = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(format!(
                "{entry:?} is not KEY=VALUE (example: kubetun.io/gateway=true)"
            ));
        };
        let (key, value) = (key.trim(), value.trim());
        label_key(key).map_err(|why| format!("{entry:?}: label key {key:?} {why}"))?;
        label_value(value).map_err(|why| format!("{entry:?}: label value {value:?} {why}"))?;
        if selector.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("{entry:?}: label key {key:?} is given twice"));
        }
    }
    Ok(NodeSelector(selector))
}

/// Longest label name and label value.
const LABEL_MAX: usize = 63;
/// Longest label key prefix (a DNS subdomain).
const PREFIX_MAX: usize = 253;

/// `[prefix/]name`: the prefix a DNS subdomain, the name as [`label_value`] but not empty.
fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        dns_subdomain(prefix).map_err(|why| format!("has a bad prefix {prefix:?}: {why}"))?;
    }
    if name.is_empty() {
        return Err(match prefix {
            Some(_) => "has an empty name (the part after the '/')".into(),
            None => "is empty".into(),
        });
    }
    label_name(name).map_err(|why| {
        if prefix.is_some() {
            format!("has a bad name {name:?}: {why}")
        } else {
            why
        }
    })
}

/// A label value: empty, or a label name.
fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        Ok(())
    } else {
        label_name(value)
    }
}

/// At most 63 of `[A-Za-z0-9._-]`, starting and ending with a letter or digit.
fn label_name(name: &str) -> Result<(), String> {
    if name.len() > LABEL_MAX {
        return Err(format!(
            "is {} characters long, at most {LABEL_MAX} are allowed",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "contains {bad:?}: only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alphanumeric(name.chars().next()) || !alphanumeric(name.chars().last()) {
        return Err("must start and end with a letter or digit".into());
    }
    Ok(())
}

/// A DNS subdomain (RFC 1123): at most 253 characters, dot-separated labels of `[a-z0-9-]`,
/// each starting and ending with a letter or digit.
fn dns_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > PREFIX_MAX {
        return Err(format!(
            "is {} characters long, at most {PREFIX_MAX} are allowed",
            name.len()
        ));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(
                "must be a DNS subdomain: lowercase letters, digits, '-' and '.', each \
                 dot-separated part starting and ending with a letter or digit"
                    .into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_flags_win_and_missing_ones_come_from_the_record() {
        let recorded = Settings {
            hub: Some(true),
            image: Some("old".into()),
            external_cidr: Some(parse_cidrs("10.70.0.0/16").unwrap()),
            ..Settings::default()
        };
        let given = Settings {
            image: Some("new".into()),
            external_cidr: Some(parse_cidrs("").unwrap()),
            ..Settings::default()
        };
        let (merged, kept) = given.or_recorded(&Settings::from_json(Some(&recorded.to_json())));
        assert_eq!(merged.hub, Some(true));
        assert_eq!(merged.image.as_deref(), Some("new"));
        assert_eq!(merged.external_cidr, Some(Cidrs(vec![])));
        assert_eq!(kept, ["--hub"]);
    }

    #[test]
    fn the_gateway_node_selector_is_recorded_kept_and_cleared() {
        let recorded = Settings {
            gateway_node_selector: Some(parse_node_selector("kubetun.io/gateway=true").unwrap()),
            ..Settings::default()
        };
        let json = recorded.to_json();
        assert_eq!(
            json,
            r#"{"gatewayNodeSelector":{"kubetun.io/gateway":"true"}}"#
        );
        let read = Settings::from_json(Some(&json));
        assert_eq!(read, recorded);

        // A re-run without the flag keeps it and says so.
        let (merged, kept) = Settings::default().or_recorded(&read);
        assert_eq!(merged.gateway_node_selector, recorded.gateway_node_selector);
        assert_eq!(kept, ["--gateway-node-selector"]);

        // `--gateway-node-selector ""` clears it, and that is recorded in turn.
        let cleared = Settings {
            gateway_node_selector: Some(parse_node_selector("").unwrap()),
            ..Settings::default()
        };
        let (merged, kept) = cleared.or_recorded(&read);
        assert_eq!(merged.gateway_node_selector, Some(NodeSelector::default()));
        assert!(kept.is_empty(), "{kept:?}");
        let again = Settings::from_json(Some(&merged.to_json()));
        assert_eq!(again.gateway_node_selector, Some(NodeSelector::default()));

        // A record from before the flag existed reads as "not given".
        let old = Settings::from_json(Some(&r#"{"hub":true}"#.to_owned()));
        assert_eq!(old.gateway_node_selector, None);
    }

    #[test]
    fn node_selectors_parse() {
        let selector = parse_node_selector(
            " kubetun.io/gateway=true, node-role.kubernetes.io/edge= ,zone=eu-west-1a",
        )
        .unwrap();
        assert_eq!(
            selector.0,
            BTreeMap::from([
                ("kubetun.io/gateway".to_owned(), "true".to_owned()),
                ("node-role.kubernetes.io/edge".to_owned(), String::new()),
                ("zone".to_owned(), "eu-west-1a".to_owned()),
            ])
        );
        assert_eq!(
            selector.to_flag(),
            "kubetun.io/gateway=true,node-role.kubernetes.io/edge=,zone=eu-west-1a"
        );
        assert_eq!(parse_node_selector("").unwrap(), NodeSelector::default());
        assert_eq!(parse_node_selector(" , ").unwrap(), NodeSelector::default());
        let longest = "a".repeat(63);
        assert!(parse_node_selector(&format!("{longest}={longest}")).is_ok());
        assert!(parse_node_selector("A_b.c-D=x.Y_z-1").is_ok());
    }

    #[test]
    fn bad_node_selectors_name_the_entry_and_the_reason() {
        let long = "a".repeat(64);
        let cases = [
            ("zone", "\"zone\" is not KEY=VALUE"),
            ("=x", "\"=x\": label key \"\" is empty"),
            ("-zone=x", "label key \"-zone\" must start and end"),
            ("zone-=x", "must start and end with a letter or digit"),
            ("zo ne=x", "contains ' '"),
            ("zone=a b", "label value \"a b\" contains ' '"),
            ("zone=-a", "label value \"-a\" must start and end"),
            ("zone=a=b", "label value \"a=b\" contains '='"),
            (&format!("zone={long}"), "is 64 characters long"),
            (&format!("{long}=x"), "is 64 characters long"),
            ("Kubetun.io/gateway=true", "bad prefix \"Kubetun.io\""),
            ("kubetun..io/gateway=true", "must be a DNS subdomain"),
            ("-kubetun.io/gateway=true", "must be a DNS subdomain"),
            ("/gateway=true", "bad prefix \"\": is empty"),
            ("kubetun.io/=true", "has an empty name"),
            ("kubetun.io/a/b=true", "bad name \"a/b\": contains '/'"),
            (
                "zone=a,zone=b",
                "\"zone=b\": label key \"zone\" is given twice",
            ),
        ];
        for (text, wanted) in cases {
            let error = parse_node_selector(&format!("ok=1,{text}")).unwrap_err();
            assert!(error.contains(wanted), "{text:?}: {error}");
        }
        let error = parse_node_selector(&format!("a={long}")).unwrap_err();
        assert!(error.starts_with(&format!("\"a={long}\"")), "{error}");
        let prefix = format!("{}.io/x=1", "a".repeat(251));
        assert!(
            parse_node_selector(&prefix)
                .unwrap_err()
                .contains("at most 253"),
            "{prefix}"
        );
    }
}

//! The settings of `kubetun install` that a re-run keeps: every flag given is recorded on the
//! controller's ConfigMap (annotation `net.kubetun.io/install-settings`, JSON), and a re-run
//! without that flag uses the recorded value, so `kubetun install --image …` on a hub stays a
//! hub with replicated gateways. Nothing secret is among them.

use serde::{Deserialize, Serialize};

pub use kubetun_controller::cluster_info::{Cidrs, parse_cidrs};

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
}

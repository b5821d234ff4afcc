//! Field types several kinds share: a cluster's identity, a WireGuard endpoint, a CIDR and
//! its view, and the schemas of CIDR strings.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Identity of a cluster: a stable ID and a human name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// Stable unique cluster ID.
    #[schemars(length(min = 1, max = 63))]
    pub id: String,
    /// Human readable cluster name.
    #[serde(default)]
    pub name: String,
}

/// A WireGuard endpoint: address (IP or DNS name) and UDP port.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP address or DNS name.
    #[schemars(length(min = 1, max = 253))]
    pub address: String,
    /// UDP port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.address.contains(':') {
            write!(f, "[{}]:{}", self.address, self.port)
        } else {
            write!(f, "{}:{}", self.address, self.port)
        }
    }
}

/// A real CIDR and the CIDR a cluster uses for it. `view == real` means not remapped.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CidrMapping {
    /// The CIDR as its owner announces it (real addresses on the wire).
    #[schemars(schema_with = "cidr_schema")]
    pub real: String,
    /// The CIDR the viewing cluster uses for it (same prefix length).
    #[schemars(schema_with = "cidr_schema")]
    pub view: String,
}

impl CidrMapping {
    /// True when the view differs from the real CIDR.
    pub fn is_remapped(&self) -> bool {
        self.real != self.view
    }
}

/// Pattern an IPv4 or IPv6 CIDR must match in the schema. It accepts exactly the address
/// forms the controller parses (IPv6 in full or `::`-compressed form, no zone, no embedded
/// IPv4) and prefix lengths in range; host bits are checked by the controller. RE2 syntax, as
/// the API server evaluates it.
pub const CIDR_PATTERN: &str = concat!(
    "^(",
    r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])",
    "|",
    "(",
    r"([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,7}:",
    r"|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}",
    r"|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}",
    r"|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}",
    r"|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}",
    r"|:((:[0-9a-fA-F]{1,4}){1,7}|:)",
    ")",
    r"/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])",
    ")$"
);

/// Schema of one CIDR string.
pub fn cidr_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": CIDR_PATTERN,
        "maxLength": 49,
    })
}

/// Schema of a list of CIDR strings.
pub fn cidr_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "string", "pattern": CIDR_PATTERN, "maxLength": 49 },
        "maxItems": 64,
    })
}

/// Schema of an optional list of CIDR strings (`null` distinct from `[]`).
pub fn optional_cidr_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "items": { "type": "string", "pattern": CIDR_PATTERN, "maxLength": 49 },
        "maxItems": 64,
    })
}

/// How a cluster's gateway admits a linked cluster's packets to its own addresses.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Isolation {
    /// Every pod and external address is reachable from the linked cluster (a link before
    /// isolation existed; what an absent setting of an existing install means).
    #[default]
    Open,
    /// Only the endpoints of the Services exported to the linked cluster, the replies to
    /// connections this cluster opened, and the ICMP errors that belong to either.
    Exported,
}

impl Isolation {
    /// The name in specs, flags and output: `open` or `exported`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Isolation::Open => "open",
            Isolation::Exported => "exported",
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Isolation {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "open" => Ok(Isolation::Open),
            "exported" => Ok(Isolation::Exported),
            other => Err(format!(
                "isolation {other:?}: expected `open` or `exported`"
            )),
        }
    }
}

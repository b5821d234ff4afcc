//! Services across clusters: the credential Secrets the connector grants and the services
//! sync reads, the ServiceImports, EndpointSlices and derived Services the sync writes and
//! the CLI and the lab read.

/// Label of a Secret holding a linked cluster's credential (key [`CREDENTIAL_KEY`]) to read
/// its ExportedServices; the value is that cluster's id.
pub const CREDENTIAL_LABEL: &str = "net.kubetun.io/services-of";
/// Key of the kubeconfig in a credential Secret.
pub const CREDENTIAL_KEY: &str = "kubeconfig";
/// Annotation of the credential Secret: when its token expires (RFC 3339).
pub const EXPIRES_ANNOTATION: &str = "net.kubetun.io/expires";
/// Annotation of the credential Secret: the API server it names.
pub const SERVER_ANNOTATION: &str = "net.kubetun.io/server";
/// Label of the ServiceImports kubetun manages (value [`MANAGED_BY`]).
pub const MANAGED_LABEL: &str = "app.kubernetes.io/managed-by";

/// Label of an imported EndpointSlice: the ServiceImport's name.
pub const SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
/// Label of an imported EndpointSlice: the exporting cluster's id.
pub const SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";
/// The EndpointSlice controller label kube-proxy reads: the derived Service's name.
pub const KUBE_SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Who manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// kubetun's value of [`MANAGED_BY_LABEL`] and [`MANAGED_LABEL`].
pub const MANAGED_BY: &str = "kubetun.io";
/// Label of a derived Service: the ServiceImport it serves.
pub const DERIVED_FOR_LABEL: &str = "net.kubetun.io/service-import";

/// The ClientIdentity in which a client cluster answers `exporter`'s selectors.
pub fn identity_name(exporter: &str) -> String {
    format!("for-{exporter}")
}

/// On a ServiceExport: the comma-separated ids of the clusters that may import it (the MCS
/// API's ServiceExport has no field for it); absent: every linked cluster.
pub const CONSUMERS_ANNOTATION: &str = "net.kubetun.io/consumers";

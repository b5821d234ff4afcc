//! Reads of TunnelEndpoints that programs besides the operator need (the route agent, the
//! standby replica).

use kube::api::Api;
use kubetun_crds::{TunnelEndpoint, TunnelEndpointSpec};

/// The spec of every TunnelEndpoint of `namespace` not being deleted, sorted by name.
pub async fn list_specs(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<TunnelEndpointSpec>, kube::Error> {
    let mut endpoints = Api::<TunnelEndpoint>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default())
        .await?
        .items;
    endpoints.sort_by_key(kube::ResourceExt::name_any);
    Ok(endpoints
        .into_iter()
        .filter(|te| te.metadata.deletion_timestamp.is_none())
        .map(|te| te.spec)
        .collect())
}

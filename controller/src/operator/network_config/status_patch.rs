//! Status writes of the NetworkConfig controller: server-side apply on the status
//! subresource, as the controller's field manager.

use kube::Resource;
use kube::api::Api;
use serde::Serialize;

use crate::operator::network_config::error::Error;
use crate::plumbing::cluster_info::FIELD_MANAGER;
use crate::plumbing::runtime;

/// Writes `status` with server-side apply on the status subresource, as this controller's
/// field manager; returns the object as written.
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl Serialize,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(runtime::apply_status(api, name, FIELD_MANAGER, status).await?)
}

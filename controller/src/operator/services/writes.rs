//! How the services loop writes: one field manager, a server-side apply only when the object
//! differs from what this process last wrote (a digest per object), deletes that tolerate a
//! missing object.

use std::collections::HashMap;
use std::hash::Hasher as _;

use kube::api::{Api, DeleteParams, Patch, PatchParams};

/// Field manager of every write.
pub(super) const FIELD_MANAGER: &str = "kubetun-services";

/// Server-side applies `object` unless `written` holds its digest (it is what was last
/// written); returns the key and digest to record when it wrote.
pub(super) async fn apply_changed<K>(
    api: &Api<K>,
    name: &str,
    object: &K,
    written: &HashMap<String, u64>,
) -> Result<Option<(String, u64)>, kube::Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let key = key::<K>(&namespace, name);
    let digest = hash(&serde_json::to_string(object).unwrap_or_default());
    if written.get(&key) == Some(&digest) {
        return Ok(None);
    }
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(Some((key, digest)))
}

pub(super) async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

pub(super) fn key<K: kube::Resource<DynamicType = ()>>(namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", K::kind(&()))
}

pub(super) fn hash(value: &impl std::hash::Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

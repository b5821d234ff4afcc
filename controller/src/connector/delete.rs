//! Deleting what the connector made: [`delete_ignoring_missing`] (a delete that finds
//! nothing is done) and what one side's teardown deleted ([`Removed`]).

use std::fmt;

use kube::Resource;
use kube::api::{Api, DeleteParams};

/// What one side of a disconnect or reset deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// `Kind namespace/name` of every deleted object.
    pub objects: Vec<String>,
    /// The same objects as kind and name, for [`super::wait_removed`].
    pub deleted: Vec<(&'static str, String)>,
}

/// Deletes `name`; one that is gone already counts as deleted.
pub(super) async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(error) => Err(error),
    }
}

//! The gateway key Secret (`kubetun-gateway-key`): the key generated once and kept there,
//! read back as [`GatewayKeys`], and replaced by a key rotation ([`begin_rotation`] adds the
//! previous key, [`end_rotation`] removes it; both write with the Secret's resourceVersion as
//! precondition, so concurrent runs cannot interleave).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kubetun_crds::contract::gateway_key::{
    PREVIOUS_PRIVATE_KEY_FIELD, PRIVATE_KEY_FIELD, PUBLIC_KEY_FIELD, SECRET_NAME,
};

use crate::keys::{GatewayKey, GatewayKeys, KeyError};

/// How often a rotation step re-reads the Secret after a conflicting write.
const CONFLICT_RETRIES: usize = 5;

impl GatewayKey {
    /// Reads the key from Secret [`SECRET_NAME`] in `namespace`, creating it with a fresh key
    /// when absent. Two controllers racing both end up with the key that won the create.
    pub async fn load_or_create(client: kube::Client, namespace: &str) -> Result<Self, KeyError> {
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        if let Some(secret) = secrets.get_opt(SECRET_NAME).await? {
            return Self::from_secret_object(&secret);
        }
        let key = Self::generate();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(SECRET_NAME.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/part-of".to_owned(),
                    "kubetun".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (
                    PRIVATE_KEY_FIELD.to_owned(),
                    ByteString(key.private_base64().into_bytes()),
                ),
                (
                    PUBLIC_KEY_FIELD.to_owned(),
                    ByteString(key.public_base64().to_owned().into_bytes()),
                ),
            ])),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(key),
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                Self::from_secret_object(&secrets.get(SECRET_NAME).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn from_secret_object(secret: &Secret) -> Result<Self, KeyError> {
        let private = secret_field(secret, PRIVATE_KEY_FIELD).ok_or(KeyError::BadSecret)?;
        Self::from_private_base64(private).map_err(|_| KeyError::BadSecret)
    }
}

impl GatewayKeys {
    /// The keys of the Secret object (a malformed previous key counts as none: it could
    /// only keep a rotation from ending).
    pub fn from_secret(secret: &Secret) -> Result<Self, KeyError> {
        let current = GatewayKey::from_secret_object(secret)?;
        let previous = secret_field(secret, PREVIOUS_PRIVATE_KEY_FIELD)
            .and_then(|text| GatewayKey::from_private_base64(text).ok())
            .filter(|previous| previous.public_base64() != current.public_base64());
        Ok(Self { current, previous })
    }

    /// Reads the keys, creating the Secret with a fresh key when absent.
    pub async fn load_or_create(client: kube::Client, namespace: &str) -> Result<Self, KeyError> {
        GatewayKey::load_or_create(client.clone(), namespace).await?;
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        Self::from_secret(&secrets.get(SECRET_NAME).await?)
    }
}

fn secret_field<'s>(secret: &'s Secret, field: &str) -> Option<&'s str> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(field))
        .and_then(|b| std::str::from_utf8(&b.0).ok())
}

/// How [`begin_rotation`] found the Secret.
#[derive(Debug, Clone, PartialEq)]
pub enum RotationStart {
    /// A new key was generated; the former one is kept as the previous key.
    Started(GatewayKeys),
    /// A rotation was in progress already (an earlier run stopped before it ended): it goes
    /// on with its key.
    Resumed(GatewayKeys),
}

impl RotationStart {
    /// The keys either way.
    pub fn keys(&self) -> &GatewayKeys {
        match self {
            Self::Started(keys) | Self::Resumed(keys) => keys,
        }
    }
}

/// Starts a key rotation in `namespace`: a fresh key becomes the current one and the current
/// one the previous one, unless a rotation is in progress already (then it is resumed as is).
pub async fn begin_rotation(
    client: kube::Client,
    namespace: &str,
) -> Result<RotationStart, KeyError> {
    let started = update_keys(client, namespace, |keys, _| {
        if keys.previous.is_some() {
            return Err(keys);
        }
        Ok(GatewayKeys {
            current: GatewayKey::generate(),
            previous: Some(keys.current),
        })
    })
    .await?;
    Ok(match started {
        Ok(next) => RotationStart::Started(next),
        Err(keys) => RotationStart::Resumed(keys),
    })
}

/// Ends the rotation that made `current_public` the current key: the previous private key is
/// removed from the Secret. Returns false when there was nothing to end (no previous key, or
/// the Secret moved on to another current key).
pub async fn end_rotation(
    client: kube::Client,
    namespace: &str,
    current_public: &str,
) -> Result<bool, KeyError> {
    let ended = update_keys(client, namespace, |keys, secret| {
        let has_previous = secret_field(secret, PREVIOUS_PRIVATE_KEY_FIELD).is_some();
        if !has_previous || keys.current.public_base64() != current_public {
            return Err(keys);
        }
        Ok(GatewayKeys {
            current: keys.current,
            previous: None,
        })
    })
    .await?;
    Ok(ended.is_ok())
}

/// Reads the key Secret and writes what `change` makes of its keys, conditional on the
/// resourceVersion read, again on a conflict. `change` returns `Err(keys)` to write nothing;
/// the result is what it returned for the version that was kept.
async fn update_keys(
    client: kube::Client,
    namespace: &str,
    change: impl Fn(GatewayKeys, &Secret) -> Result<GatewayKeys, GatewayKeys>,
) -> Result<Result<GatewayKeys, GatewayKeys>, KeyError> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let failed = |action: &'static str| {
        move |source: kube::Error| KeyError::Rotation {
            action,
            source: Box::new(source),
        }
    };
    for _ in 0..CONFLICT_RETRIES {
        let secret = secrets
            .get_opt(SECRET_NAME)
            .await
            .map_err(failed("read"))?
            .ok_or(KeyError::Missing)?;
        let keys = GatewayKeys::from_secret(&secret)?;
        let next = match change(keys, &secret) {
            Ok(next) => next,
            unchanged @ Err(_) => return Ok(unchanged),
        };
        match write_keys(&secrets, secret, &next).await {
            Ok(()) => return Ok(Ok(next)),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => return Err(failed("update")(source)),
        }
    }
    Err(KeyError::Contended)
}

/// Replaces the Secret's key fields with `keys`, conditional on the resourceVersion read
/// (other data fields, labels and annotations stay).
async fn write_keys(
    secrets: &Api<Secret>,
    mut secret: Secret,
    keys: &GatewayKeys,
) -> Result<(), kube::Error> {
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    data.insert(
        PRIVATE_KEY_FIELD.to_owned(),
        ByteString(keys.current.private_base64().into_bytes()),
    );
    data.insert(
        PUBLIC_KEY_FIELD.to_owned(),
        ByteString(keys.current.public_base64().to_owned().into_bytes()),
    );
    match &keys.previous {
        Some(previous) => data.insert(
            PREVIOUS_PRIVATE_KEY_FIELD.to_owned(),
            ByteString(previous.private_base64().into_bytes()),
        ),
        None => data.remove(PREVIOUS_PRIVATE_KEY_FIELD),
    };
    // Written as `data`; a `stringData` copy would be merged back in by the API server.
    secret.string_data = None;
    secrets
        .replace(SECRET_NAME, &PostParams::default(), &secret)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::GatewayKey;

    fn secret_of(current: &GatewayKey, previous: Option<&str>) -> Secret {
        let mut data = BTreeMap::from([(
            PRIVATE_KEY_FIELD.to_owned(),
            ByteString(current.private_base64().into_bytes()),
        )]);
        if let Some(previous) = previous {
            data.insert(
                PREVIOUS_PRIVATE_KEY_FIELD.to_owned(),
                ByteString(previous.as_bytes().to_vec()),
            );
        }
        Secret {
            data: Some(data),
            ..Secret::default()
        }
    }

    #[test]
    fn the_previous_key_is_read_only_when_usable_and_never_printed() {
        let (current, previous) = (GatewayKey::generate(), GatewayKey::generate());
        let keys = GatewayKeys::from_secret(&secret_of(&current, Some(&previous.private_base64())))
            .unwrap();
        assert_eq!(
            keys.previous.as_ref().map(GatewayKey::public_base64),
            Some(previous.public_base64())
        );
        let printed = format!("{keys:?}");
        assert!(printed.contains(previous.public_base64()));
        assert!(!printed.contains(&previous.private_base64()));
        assert!(!printed.contains(&current.private_base64()));

        let garbled = GatewayKeys::from_secret(&secret_of(&current, Some("garbage"))).unwrap();
        assert!(garbled.previous.is_none());
        let same = GatewayKeys::from_secret(&secret_of(&current, Some(&current.private_base64())))
            .unwrap();
        assert!(same.previous.is_none());
        assert!(GatewayKeys::from_secret(&Secret::default()).is_err());
    }
}

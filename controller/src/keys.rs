//! The gateway's WireGuard key pair: generated once, kept in Secret `kubetun-gateway-key`.
//!
//! Only the public key ever leaves this module in CRs, ConfigMaps or logs; [`GatewayKey`]'s
//! `Debug` prints the public half only. [`parse_public_key`] is pure and validates keys peers
//! announce.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use x25519_dalek::{PublicKey, StaticSecret};

/// Name of the Secret holding the gateway's private key.
pub const SECRET_NAME: &str = "kubetun-gateway-key";
/// Key of the private key (base64) in the Secret's data.
pub const PRIVATE_KEY_FIELD: &str = "privateKey";
/// Key of the public key (base64) in the Secret's data.
pub const PUBLIC_KEY_FIELD: &str = "publicKey";

/// What went wrong with a key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The string is not base64 of exactly 32 bytes.
    #[error("{what} is not a base64 X25519 key (expected 44 characters encoding 32 bytes)")]
    Malformed {
        /// Which key (for the message), never its value.
        what: &'static str,
    },
    /// The Secret exists but has no usable private key.
    #[error(
        "Secret {SECRET_NAME} has no valid {PRIVATE_KEY_FIELD}; delete it to generate a new key"
    )]
    BadSecret,
    /// Reading or creating the Secret failed.
    #[error("cannot read or create Secret {SECRET_NAME}: {0}")]
    Kube(#[from] kube::Error),
}

/// Decodes a base64 X25519 public key a peer announced.
pub fn parse_public_key(key: &str) -> Result<[u8; 32], KeyError> {
    decode_key(key, "public key")
}

fn decode_key(key: &str, what: &'static str) -> Result<[u8; 32], KeyError> {
    BASE64
        .decode(key.trim())
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or(KeyError::Malformed { what })
}

/// The gateway's key pair.
#[derive(Clone)]
pub struct GatewayKey {
    secret: StaticSecret,
    public: String,
}

impl std::fmt::Debug for GatewayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl GatewayKey {
    /// A fresh random key pair.
    pub fn generate() -> Self {
        Self::from_secret(StaticSecret::random_from_rng(rand_core::OsRng))
    }

    /// The key pair of a base64 private key.
    pub fn from_private_base64(private: &str) -> Result<Self, KeyError> {
        decode_key(private, "private key").map(|bytes| Self::from_secret(StaticSecret::from(bytes)))
    }

    fn from_secret(secret: StaticSecret) -> Self {
        let public = BASE64.encode(PublicKey::from(&secret).as_bytes());
        Self { secret, public }
    }

    /// The public key, base64.
    pub fn public_base64(&self) -> &str {
        &self.public
    }

    /// The private key, base64: only for the gateway's Apply request.
    pub fn private_base64(&self) -> String {
        BASE64.encode(self.secret.as_bytes())
    }

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
                    ByteString(key.public.clone().into_bytes()),
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
        let private = secret
            .data
            .as_ref()
            .and_then(|d| d.get(PRIVATE_KEY_FIELD))
            .and_then(|b| std::str::from_utf8(&b.0).ok())
            .ok_or(KeyError::BadSecret)?;
        Self::from_private_base64(private).map_err(|_| KeyError::BadSecret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_private_key() {
        let key = GatewayKey::generate();
        let printed = format!("{key:?}");
        assert!(printed.contains(key.public_base64()));
        assert!(!printed.contains(&key.private_base64()));
    }

    #[test]
    fn private_key_round_trips_to_the_same_public_key() {
        let key = GatewayKey::generate();
        let again = GatewayKey::from_private_base64(&key.private_base64()).unwrap();
        assert_eq!(again.public_base64(), key.public_base64());
        assert_eq!(key.public_base64().len(), 44);
    }

    #[test]
    fn public_keys_are_validated() {
        let key = GatewayKey::generate();
        assert!(parse_public_key(key.public_base64()).is_ok());
        assert!(parse_public_key("not-a-key").is_err());
        assert!(parse_public_key(&BASE64.encode([0u8; 31])).is_err());
    }
}

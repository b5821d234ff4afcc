//! The gateway's WireGuard key pair, pure (no IO): [`GatewayKey`] and [`GatewayKeys`] (the
//! current pair and, while a rotation is in progress, the previous one). The Secret they are
//! kept in is read and written by `plumbing::key_secret`, one floor up.
//!
//! Only the public key ever leaves this module in CRs, ConfigMaps or logs; [`GatewayKey`]'s
//! `Debug` prints the public half only. [`parse_public_key`] validates keys peers announce.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use kubetun_crds::contract::gateway_key::{PRIVATE_KEY_FIELD, SECRET_NAME};
use x25519_dalek::{PublicKey, StaticSecret};

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
    /// Reading or writing the Secret during a rotation failed.
    #[error("cannot {action} Secret {SECRET_NAME}: {source}")]
    Rotation {
        /// What was attempted.
        action: &'static str,
        /// The API error (boxed: it is large, and this error travels in others).
        #[source]
        source: Box<kube::Error>,
    },
    /// The Secret does not exist (the controller creates it when it starts).
    #[error("Secret {SECRET_NAME} does not exist: is kubetun-controller running in this cluster?")]
    Missing,
    /// Other writers kept changing the Secret.
    #[error("Secret {SECRET_NAME} kept changing under the rotation; run it again")]
    Contended,
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
}

/// The keys Secret [`SECRET_NAME`] holds.
#[derive(Clone)]
pub struct GatewayKeys {
    /// The key the gateway uses, and announces to peers.
    pub current: GatewayKey,
    /// While a rotation is in progress: the key used before, still serving the peers that
    /// have not completed a handshake with `current`.
    pub previous: Option<GatewayKey>,
}

impl std::fmt::Debug for GatewayKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayKeys")
            .field("current", &self.current)
            .field("previous", &self.previous)
            .finish()
    }
}

impl PartialEq for GatewayKeys {
    fn eq(&self, other: &Self) -> bool {
        let previous = |keys: &Self| keys.previous.as_ref().map(|k| k.public.clone());
        self.current.public == other.current.public && previous(self) == previous(other)
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

//! 32-byte WireGuard keys (X25519 private/public keys and preshared keys) with the two text
//! encodings in use: base64 (wg-quick files, the gRPC API) and lowercase hex (the UAPI).
//!
//! `Debug` never prints key material.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// Why a key string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not valid base64, or not exactly 32 bytes once decoded.
    #[error("invalid base64 key (expected 44 characters encoding 32 bytes)")]
    Base64,
    /// Not exactly 64 hex digits.
    #[error("invalid hex key (expected 64 hex digits)")]
    Hex,
}

/// A 32-byte key. Equality is constant-time-irrelevant here: keys are compared on the control
/// path only, never against attacker-chosen guesses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key([u8; 32]);

impl Key {
    /// Wraps raw key bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw key bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// True for the all-zero key, which the UAPI uses to mean "no key".
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    /// Parses the base64 form.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        let decoded = BASE64.decode(text.trim()).map_err(|_| KeyError::Base64)?;
        let bytes: [u8; 32] = decoded.try_into().map_err(|_| KeyError::Base64)?;
        Ok(Self(bytes))
    }

    /// The base64 form.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }

    /// Parses the hex form (either case).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return Err(KeyError::Hex);
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = (hex_digit(pair[0]).ok_or(KeyError::Hex)? << 4)
                | hex_digit(pair[1]).ok_or(KeyError::Hex)?;
        }
        Ok(Self(bytes))
    }

    /// The lowercase hex form.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(64);
        for byte in self.0 {
            out.push(char::from(DIGITS[usize::from(byte >> 4)]));
            out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
        }
        out
    }

    /// Treats this key as an X25519 private key and derives its public key.
    pub fn public_key(&self) -> Key {
        let secret = boringtun::x25519::StaticSecret::from(self.0);
        Key(boringtun::x25519::PublicKey::from(&secret).to_bytes())
    }

    /// A fresh random private key.
    pub fn generate_private() -> Key {
        let secret = boringtun::x25519::StaticSecret::random_from_rng(rand_core::OsRng);
        Key(secret.to_bytes())
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_hex_round_trip() {
        let key = Key::generate_private();
        assert_eq!(Key::from_base64(&key.to_base64()), Ok(key));
        assert_eq!(Key::from_hex(&key.to_hex()), Ok(key));
        assert_eq!(Key::from_hex(&key.to_hex().to_uppercase()), Ok(key));
    }

    #[test]
    fn rejects_wrong_lengths_and_digits() {
        assert_eq!(Key::from_base64("AAAA"), Err(KeyError::Base64));
        assert_eq!(Key::from_hex(&"0".repeat(63)), Err(KeyError::Hex));
        assert_eq!(Key::from_hex(&"g".repeat(64)), Err(KeyError::Hex));
    }

    #[test]
    fn public_key_matches_known_vector() {
        // RFC 7748 section 6.1 (Alice).
        let private =
            Key::from_hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .expect("valid hex");
        assert_eq!(
            private.public_key().to_hex(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }

    #[test]
    fn debug_hides_material() {
        assert_eq!(format!("{:?}", Key::from_bytes([7; 32])), "Key(..)");
    }
}

//! The gateway key Secret: written by the controller (and by a key rotation the CLI runs),
//! read by the controller and the lab.

/// Name of the Secret holding the gateway's private key.
pub const SECRET_NAME: &str = "kubetun-gateway-key";
/// Key of the private key (base64) in the Secret's data.
pub const PRIVATE_KEY_FIELD: &str = "privateKey";
/// Key of the public key (base64) in the Secret's data.
pub const PUBLIC_KEY_FIELD: &str = "publicKey";
/// Key of the previous private key (base64) in the Secret's data, present only while a key
/// rotation is in progress.
pub const PREVIOUS_PRIVATE_KEY_FIELD: &str = "previousPrivateKey";

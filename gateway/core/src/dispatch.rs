//! Classification of incoming WireGuard datagrams by message type and receiver index, before
//! any cryptography: the UDP reader uses it to find the peer a datagram belongs to.
//!
//! Pure; message layouts are those of the WireGuard whitepaper (all integers little-endian,
//! three reserved zero bytes after the type).

/// Size of a handshake initiation (type 1).
pub const INITIATION_LEN: usize = 148;
/// Size of a handshake response (type 2).
pub const RESPONSE_LEN: usize = 92;
/// Size of a cookie reply (type 3).
pub const COOKIE_REPLY_LEN: usize = 64;
/// Smallest transport data message (type 4): a keepalive.
pub const MIN_DATA_LEN: usize = 32;

/// What an incoming datagram is, as far as routing it to a peer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// A handshake initiation: the peer is found by decrypting its static key.
    Initiation,
    /// A handshake response, addressed to the local index `receiver` (our 24-bit peer index).
    Response {
        /// `receiver_idx >> 8`.
        receiver: u32,
    },
    /// A cookie reply, addressed to the local index `receiver`.
    CookieReply {
        /// `receiver_idx >> 8`.
        receiver: u32,
    },
    /// Transport data (or a keepalive), addressed to the local index `receiver`.
    Data {
        /// `receiver_idx >> 8`.
        receiver: u32,
    },
    /// Not a WireGuard message.
    Invalid,
}

impl Incoming {
    /// Whether a successfully processed message of this kind proves the sender's address
    /// (endpoint roaming). Cookie replies prove nothing about the peer.
    pub fn authenticates_source(self) -> bool {
        matches!(
            self,
            Incoming::Initiation | Incoming::Response { .. } | Incoming::Data { .. }
        )
    }
}

/// Classifies `datagram` by its header and length. The low 8 bits of a receiver index are
/// boringtun's per-session counter; the upper 24 bits are the index the peer was created with.
pub fn classify(datagram: &[u8]) -> Incoming {
    let Some(header) = datagram.get(..4) else {
        return Incoming::Invalid;
    };
    let message_type = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let receiver_at = |offset: usize| {
        datagram
            .get(offset..offset + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8)
    };
    match (message_type, datagram.len()) {
        (1, INITIATION_LEN) => Incoming::Initiation,
        (2, RESPONSE_LEN) => receiver_at(8).map_or(Incoming::Invalid, |receiver| {
            Incoming::Response { receiver }
        }),
        (3, COOKIE_REPLY_LEN) => receiver_at(4).map_or(Incoming::Invalid, |receiver| {
            Incoming::CookieReply { receiver }
        }),
        (4, len) if len >= MIN_DATA_LEN => {
            receiver_at(4).map_or(Incoming::Invalid, |receiver| Incoming::Data { receiver })
        }
        _ => Incoming::Invalid,
    }
}

/// Whether an outgoing datagram produced by boringtun is a handshake initiation; used to track
/// how long a peer has been trying to handshake.
pub fn is_initiation(datagram: &[u8]) -> bool {
    datagram.len() == INITIATION_LEN && datagram.first() == Some(&1)
}

/// Whether an outgoing datagram produced by boringtun is a cookie reply (sent instead of a
/// handshake response when under load).
pub fn is_cookie_reply(datagram: &[u8]) -> bool {
    datagram.len() == COOKIE_REPLY_LEN && datagram.first() == Some(&3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, len: usize, index_at: Option<(usize, u32)>) -> Vec<u8> {
        let mut m = vec![0u8; len];
        m[0] = kind;
        if let Some((offset, idx)) = index_at {
            m[offset..offset + 4].copy_from_slice(&idx.to_le_bytes());
        }
        m
    }

    #[test]
    fn classifies_each_message_type() {
        assert_eq!(classify(&message(1, 148, None)), Incoming::Initiation);
        assert_eq!(
            classify(&message(2, 92, Some((8, 0x00ab_cd01)))),
            Incoming::Response { receiver: 0xabcd }
        );
        assert_eq!(
            classify(&message(3, 64, Some((4, 0x1234_5602)))),
            Incoming::CookieReply {
                receiver: 0x12_3456
            }
        );
        assert_eq!(
            classify(&message(4, 32, Some((4, 0x0000_0201)))),
            Incoming::Data { receiver: 2 }
        );
        assert_eq!(
            classify(&message(4, 1500, Some((4, 0xffff_ffff)))),
            Incoming::Data {
                receiver: 0x00ff_ffff
            }
        );
    }

    #[test]
    fn rejects_wrong_lengths_types_and_reserved_bytes() {
        assert_eq!(classify(&[]), Incoming::Invalid);
        assert_eq!(classify(&[1, 0, 0]), Incoming::Invalid);
        assert_eq!(classify(&message(1, 147, None)), Incoming::Invalid);
        assert_eq!(classify(&message(2, 93, None)), Incoming::Invalid);
        assert_eq!(classify(&message(3, 65, None)), Incoming::Invalid);
        assert_eq!(classify(&message(4, 31, None)), Incoming::Invalid);
        assert_eq!(classify(&message(5, 148, None)), Incoming::Invalid);
        let mut reserved = message(4, 64, None);
        reserved[2] = 1;
        assert_eq!(classify(&reserved), Incoming::Invalid);
    }

    #[test]
    fn only_authenticated_kinds_roam() {
        assert!(Incoming::Initiation.authenticates_source());
        assert!(Incoming::Data { receiver: 1 }.authenticates_source());
        assert!(!Incoming::CookieReply { receiver: 1 }.authenticates_source());
        assert!(!Incoming::Invalid.authenticates_source());
    }

    /// Real boringtun messages carry our 24-bit peer index in the receiver field.
    #[test]
    fn boringtun_messages_dispatch_to_the_creating_index() {
        use boringtun::noise::{Tunn, TunnResult};
        use boringtun::x25519::{PublicKey, StaticSecret};

        let a_secret = StaticSecret::from([1u8; 32]);
        let b_secret = StaticSecret::from([2u8; 32]);
        let a_public = PublicKey::from(&a_secret);
        let b_public = PublicKey::from(&b_secret);
        let mut a = Tunn::new(a_secret, b_public, None, None, 0x00ab_cdef, None);
        let mut b = Tunn::new(b_secret, a_public, None, None, 0x0012_3456, None);
        let mut buf = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];

        let TunnResult::WriteToNetwork(init) = a.format_handshake_initiation(&mut buf, false)
        else {
            panic!("initiation expected");
        };
        assert_eq!(classify(init), Incoming::Initiation);
        assert!(is_initiation(init));
        assert!(!is_cookie_reply(init));
        let init = init.to_vec();

        // Under load, the responder answers with a cookie addressed to the initiator's index.
        let limiter = boringtun::noise::rate_limiter::RateLimiter::new(&b_public, 0);
        let source = std::net::IpAddr::from([192, 0, 2, 1]);
        match limiter.verify_packet(Some(source), &init, &mut out) {
            Err(TunnResult::WriteToNetwork(cookie)) => {
                assert!(is_cookie_reply(cookie));
                assert_eq!(
                    classify(cookie),
                    Incoming::CookieReply {
                        receiver: 0x00ab_cdef
                    }
                );
            }
            other => panic!("cookie reply expected, got {other:?}"),
        }

        let TunnResult::WriteToNetwork(response) = b.decapsulate(None, &init, &mut out) else {
            panic!("response expected");
        };
        assert_eq!(
            classify(response),
            Incoming::Response {
                receiver: 0x00ab_cdef
            }
        );
        let response = response.to_vec();

        let TunnResult::WriteToNetwork(keepalive) = a.decapsulate(None, &response, &mut buf) else {
            panic!("keepalive expected");
        };
        assert_eq!(
            classify(keepalive),
            Incoming::Data {
                receiver: 0x0012_3456
            }
        );
    }

    #[test]
    fn never_panics_on_arbitrary_prefixes() {
        let data = message(4, 200, Some((4, 7)));
        for len in 0..data.len() {
            let _ = classify(&data[..len]);
        }
    }
}

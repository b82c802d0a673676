//! The per-cluster secret in each registered URL: an HMAC of the cluster's
//! name under the server's key, so that any replica holding the key can
//! check a request's claim without a table, and no cluster can work out
//! another's.

use std::path::Path;

use kube_multicluster::ClusterName;
use ring::{hmac, rand::SecureRandom};

use crate::error::Error;

/// The shortest key a key file may hold, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The key the tokens are made under.
#[derive(Clone)]
pub(crate) struct Tokens {
    key: hmac::Key,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens")
    }
}

/// Where the key comes from.
#[derive(Clone, Debug, Default)]
pub(crate) enum KeySource {
    /// Made at random as the server starts: right for one replica.
    #[default]
    Random,
    /// Given as bytes.
    Bytes(Vec<u8>),
    /// Read from a file (a mounted Secret shared by the replicas).
    File(std::path::PathBuf),
}

impl Tokens {
    pub(crate) fn new(source: &KeySource) -> Result<Self, Error> {
        let bytes = match source {
            KeySource::Random => {
                let mut bytes = vec![0; MIN_KEY_BYTES];
                ring::rand::SystemRandom::new()
                    .fill(&mut bytes)
                    .map_err(|_| Error::Generate("no random bytes for the token key".into()))?;
                bytes
            }
            KeySource::Bytes(bytes) => bytes.clone(),
            KeySource::File(path) => read_key(path)?,
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
        })
    }

    /// The token of `cluster`: 64 hex digits.
    pub(crate) fn token(&self, cluster: &ClusterName) -> String {
        let tag = hmac::sign(&self.key, &message(cluster));
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `token` is `cluster`'s, compared in constant time.
    pub(crate) fn verify(&self, cluster: &ClusterName, token: &str) -> bool {
        let Some(tag) = unhex(token) else {
            return false;
        };
        hmac::verify(&self.key, &message(cluster), &tag).is_ok()
    }
}

fn message(cluster: &ClusterName) -> Vec<u8> {
    let mut message = b"kube-multicluster webhook cluster\0".to_vec();
    message.extend_from_slice(cluster.as_str().as_bytes());
    message
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn read_key(path: &Path) -> Result<Vec<u8>, Error> {
    let bad = |reason: String| Error::TokenKey {
        path: path.to_owned(),
        reason,
    };
    // Every byte is the key's, whatever it is: the replicas read the same
    // file, so they agree, and random bytes may be anything.
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if bytes.len() < MIN_KEY_BYTES {
        return Err(bad(format!(
            "holds {} bytes; a key needs at least {MIN_KEY_BYTES}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// A cluster's name as one URL path segment: every byte but letters,
/// digits, `-`, `.` and `_` percent-encoded, and the local cluster (whose
/// name is empty) as `~`.
pub(crate) fn segment(cluster: &ClusterName) -> String {
    if cluster.is_local() {
        return "~".into();
    }
    let mut out = String::new();
    for byte in cluster.as_str().bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The cluster a path segment names, or `None` for a malformed one.
pub(crate) fn cluster_of(segment: &str) -> Option<ClusterName> {
    if segment == "~" {
        return Some(ClusterName::local());
    }
    if segment.is_empty() {
        return None;
    }
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(ClusterName::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_its_clusters_only() {
        let tokens = Tokens::new(&KeySource::Random).unwrap();
        let a = ClusterName::from("member-a");
        let b = ClusterName::from("member-b");
        let token = tokens.token(&a);
        assert_eq!(token.len(), 64);
        assert!(tokens.verify(&a, &token));
        assert!(!tokens.verify(&b, &token));
        assert!(!tokens.verify(&a, &token[..62]));
        assert!(!tokens.verify(&a, ""));
        // Another key, another token.
        let other = Tokens::new(&KeySource::Random).unwrap();
        assert!(!other.verify(&a, &token));
        // The same key, the same token: replicas sharing a key agree.
        let shared = Tokens::new(&KeySource::Bytes(vec![7; 32])).unwrap();
        let again = Tokens::new(&KeySource::Bytes(vec![7; 32])).unwrap();
        assert_eq!(shared.token(&a), again.token(&a));
    }

    #[test]
    fn cluster_names_survive_the_path() {
        for name in ["kind-a", "", "secret/ns/name", "a b%c~", "ünï"] {
            let name = ClusterName::from(name);
            let segment = segment(&name);
            assert!(!segment.contains('/'), "{segment}");
            assert_eq!(cluster_of(&segment), Some(name));
        }
        assert_eq!(cluster_of(""), None);
        assert_eq!(cluster_of("%zz"), None);
        assert_eq!(cluster_of("%4"), None);
    }
}

//! Certificates and keys for one API server: its own CA, serving certificate,
//! client certificates and service-account signing key.

use std::net::{IpAddr, Ipv4Addr};

use base64::{Engine, engine::general_purpose::STANDARD};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SigningKey,
};

use crate::{Error, Result};

/// PEM-encoded material for one cluster. Each cluster has its own CA, so the
/// credentials of one cluster are worthless on another.
pub(crate) struct Pki {
    pub(crate) ca: CertificateAuthority,
    pub(crate) serving_cert: String,
    pub(crate) serving_key: String,
    pub(crate) admin: ClientCertificate,
    pub(crate) service_account_key: String,
    pub(crate) service_account_pub: String,
}

/// A cluster's CA, kept with its key for as long as the cluster lives, so that
/// it can sign client certificates for any user.
pub(crate) struct CertificateAuthority {
    cert: String,
    pub(crate) issuer: Issuer<'static, KeyPair>,
}

/// A client certificate and its key, PEM-encoded.
pub(crate) struct ClientCertificate {
    pub(crate) cert: String,
    pub(crate) key: String,
}

/// A `Debug` of each type that names it and none of its keys.
macro_rules! opaque_debug {
    ($($type:ty),*) => {$(
        impl std::fmt::Debug for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($type)).finish_non_exhaustive()
            }
        }
    )*};
}
pub(crate) use opaque_debug;

opaque_debug!(Pki, CertificateAuthority, ClientCertificate);

fn key(what: &'static str) -> Result<KeyPair> {
    KeyPair::generate().map_err(|source| Error::Certificate { what, source })
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

impl Pki {
    /// Generates everything for the cluster named `cluster`.
    pub(crate) fn generate(cluster: &str) -> Result<Self> {
        let cert_err = |what| move |source| Error::Certificate { what, source };

        let ca = CertificateAuthority::new(
            Some(named(&format!("envtest CA for {cluster}"))),
            ("CA key", "CA certificate"),
        )?;

        // IP SAN 127.0.0.1: valid on any port, so also through fault proxies.
        let serving_key = key("serving key")?;
        let mut serving = CertificateParams::new(vec!["localhost".to_owned()])
            .map_err(cert_err("serving certificate"))?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.distinguished_name = named("kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving
            .signed_by(&serving_key, &ca.issuer)
            .map_err(cert_err("serving certificate"))?;

        let admin = ca.client_certificate("envtest-admin", &["system:masters"])?;
        let service_account = key("service-account signing key")?;

        Ok(Self {
            ca,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin,
            service_account_key: service_account.serialize_pem(),
            service_account_pub: service_account.public_key_pem(),
        })
    }
}

impl CertificateAuthority {
    /// A new self-signed CA, whose subject is `name` if one is given;
    /// `what` names its key and its certificate in errors.
    pub(crate) fn new(
        name: Option<DistinguishedName>,
        what: (&'static str, &'static str),
    ) -> Result<Self> {
        let key = key(what.0)?;
        let mut params = CertificateParams::default();
        if let Some(name) = name {
            params.distinguished_name = name;
        }
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|source| Error::Certificate {
                what: what.1,
                source,
            })?;
        Ok(Self {
            cert: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM-encoded.
    pub(crate) fn cert(&self) -> &str {
        &self.cert
    }

    /// A client certificate for `user` in `groups`: the API server takes the
    /// user from the subject's CN and a group from each O.
    ///
    /// rcgen writes at most one value per attribute type
    /// (rustls/rcgen#81), so rcgen builds and signs the certificate with the
    /// CN alone, and the subject with all groups is put in its place and the
    /// certificate signed again.
    pub(crate) fn client_certificate(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<ClientCertificate> {
        let what = "client certificate";
        let cert_err = |source| Error::Certificate { what, source };
        let key = key("client key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = named(user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let signed = params.signed_by(&key, &self.issuer).map_err(cert_err)?;

        let malformed = || cert_err(rcgen::Error::CouldNotParseCertificate);
        let parts = children(signed.der()).ok_or_else(malformed)?;
        let [tbs, algorithm, _signature] = parts[..] else {
            return Err(malformed());
        };
        // version, serial, signature algorithm, issuer, validity, subject, key, extensions
        let mut fields = children(tbs).ok_or_else(malformed)?;
        if fields.len() < 7 || fields[0].first() != Some(&VERSION) {
            return Err(malformed());
        }
        let subject = subject(user, groups);
        fields[5] = &subject;
        let tbs = der(SEQUENCE, &fields.concat());
        let signature = self.issuer.key().sign(&tbs).map_err(cert_err)?;
        let signature = der(BIT_STRING, &[&[0][..], &signature].concat());
        let cert = der(SEQUENCE, &[&tbs[..], algorithm, &signature].concat());

        Ok(ClientCertificate {
            cert: pem("CERTIFICATE", &cert),
            key: key.serialize_pem(),
        })
    }
}

// Just enough DER to put a subject with several O into a certificate.
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const BIT_STRING: u8 = 0x03;
const OID: u8 = 0x06;
const UTF8_STRING: u8 = 0x0c;
/// `[0]`, the explicit tag of a certificate's version.
const VERSION: u8 = 0xa0;
const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
const ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];

/// `CN=<user>, O=<group>, O=<group>, ...`
fn subject(user: &str, groups: &[&str]) -> Vec<u8> {
    let attribute = |oid: &[u8], value: &str| {
        let pair = [der(OID, oid), der(UTF8_STRING, value.as_bytes())].concat();
        der(SET, &der(SEQUENCE, &pair))
    };
    let attributes = std::iter::once(attribute(&COMMON_NAME, user))
        .chain(groups.iter().map(|group| attribute(&ORGANIZATION, group)));
    der(SEQUENCE, &attributes.collect::<Vec<_>>().concat())
}

/// One DER element: tag, length, contents.
fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let len = contents.len();
    let mut out = vec![tag];
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let significant = &bytes[bytes.iter().take_while(|b| **b == 0).count()..];
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(contents);
    out
}

/// The elements inside the constructed DER element `outer`, each whole.
fn children(outer: &[u8]) -> Option<Vec<&[u8]>> {
    let (start, len) = header(outer)?;
    let mut rest = outer.get(start..start + len)?;
    let mut children = Vec::new();
    while !rest.is_empty() {
        let (start, len) = header(rest)?;
        let (child, tail) = rest.split_at_checked(start + len)?;
        children.push(child);
        rest = tail;
    }
    Some(children)
}

/// The length of an element's tag and length bytes, and of its contents.
fn header(element: &[u8]) -> Option<(usize, usize)> {
    let first = *element.get(1)?;
    if first < 0x80 {
        return Some((2, usize::from(first)));
    }
    let count = usize::from(first & 0x7f);
    let len = element
        .get(2..2 + count)?
        .iter()
        .try_fold(0usize, |len, byte| {
            len.checked_mul(256).map(|len| len + usize::from(*byte))
        })?;
    Some((2 + count, len))
}

fn pem(label: &str, der: &[u8]) -> String {
    let base64 = STANDARD.encode(der);
    let lines: Vec<&str> = base64
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_of_any_size_read_back() {
        let sizes = [0, 1, 127, 128, 255, 256, 65_536];
        let elements: Vec<Vec<u8>> = sizes.iter().map(|&n| der(SET, &vec![7; n])).collect();
        let outer = der(SEQUENCE, &elements.concat());
        let read = children(&outer).expect("well-formed");
        assert_eq!(read, elements.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(children(&outer[..outer.len() - 1]), None, "truncated");
    }

    #[test]
    fn client_certificates_name_the_user_and_every_group() {
        let pki = Pki::generate("test").unwrap();
        let cert = pki
            .ca
            .client_certificate("dave", &["staff", "readers"])
            .unwrap();
        let der = STANDARD
            .decode(
                cert.cert
                    .lines()
                    .filter(|l| !l.starts_with("-----"))
                    .collect::<String>(),
            )
            .unwrap();
        let subject = subject("dave", &["staff", "readers"]);
        assert!(der.windows(subject.len()).any(|w| w == subject));
        assert!(!format!("{:?}{:?}{cert:?}", pki, pki.ca).contains("BEGIN"));
    }
}

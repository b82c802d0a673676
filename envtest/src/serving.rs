//! Certificates for servers a test starts and the API servers call: a
//! webhook server, an aggregated API.

use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair, SanType};

use crate::{
    Error, Result,
    pki::{CertificateAuthority, opaque_debug},
};

/// A CA of its own, and the serving certificates it signs: what a server
/// started by a test presents, with the CA bundle its registrations carry.
/// Two certificates of one CA stand for a renewal.
///
/// ```
/// let ca = kube_multicluster_envtest::TestCa::new().unwrap();
/// let first = ca.serving(&["127.0.0.1", "localhost"]).unwrap();
/// let renewed = ca.serving(&["127.0.0.1", "localhost"]).unwrap();
/// assert_ne!(first.der, renewed.der);
/// assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
/// ```
pub struct TestCa(CertificateAuthority);

/// A serving certificate and its key, PEM-encoded, and the certificate's
/// DER (to compare with what a server presents).
#[derive(Clone)]
pub struct ServingCertificate {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
    /// The certificate, DER.
    pub der: Vec<u8>,
}

opaque_debug!(TestCa, ServingCertificate);

impl TestCa {
    /// A new CA.
    pub fn new() -> Result<Self> {
        CertificateAuthority::new(None, ("test CA", "test CA")).map(Self)
    }

    /// The CA's certificate, PEM: the bundle a client trusts.
    pub fn cert_pem(&self) -> &str {
        self.0.cert()
    }

    /// A serving certificate for `hosts` (DNS names or IP addresses), with
    /// a key of its own.
    pub fn serving(&self, hosts: &[&str]) -> Result<ServingCertificate> {
        let failed = |source| Error::Certificate {
            what: "serving certificate",
            source,
        };
        let mut params = CertificateParams::default();
        for host in hosts {
            let san = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*host).try_into().map_err(failed)?),
            };
            params.subject_alt_names.push(san);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.0.issuer).map_err(failed)?;
        Ok(ServingCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        })
    }
}

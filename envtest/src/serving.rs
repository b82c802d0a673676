//! Certificates for servers a test starts and the API servers call: a
//! webhook server, an aggregated API.

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::{Error, Result};

/// A CA of its own, and the serving certificates it signs: what a server
/// started by a test presents, with the CA bundle its registrations carry.
/// Two certificates of one CA stand for a renewal.
///
/// ```
/// let ca = kube_fleet_envtest::TestCa::new().unwrap();
/// let first = ca.serving(&["127.0.0.1", "localhost"]).unwrap();
/// let renewed = ca.serving(&["127.0.0.1", "localhost"]).unwrap();
/// assert_ne!(first.der, renewed.der);
/// assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
/// ```
pub struct TestCa {
    cert: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

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

impl std::fmt::Debug for ServingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertificate").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA.
    pub fn new() -> Result<Self> {
        let failed = |source| Error::Certificate {
            what: "test CA",
            source,
        };
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.self_signed(&key).map_err(failed)?;
        Ok(Self {
            cert: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA's certificate, PEM: the bundle a client trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert
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
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        Ok(ServingCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        })
    }
}

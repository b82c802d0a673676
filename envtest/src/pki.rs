//! Certificates and keys for one API server: its own CA, serving certificate,
//! admin client certificate and service-account signing key.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::{Error, Result};

/// PEM-encoded material for one cluster. Each cluster has its own CA, so the
/// credentials of one cluster are worthless on another.
pub(crate) struct Pki {
    pub(crate) ca_cert: String,
    pub(crate) serving_cert: String,
    pub(crate) serving_key: String,
    pub(crate) admin_cert: String,
    pub(crate) admin_key: String,
    pub(crate) service_account_key: String,
    pub(crate) service_account_pub: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn key(what: &'static str) -> Result<KeyPair> {
    KeyPair::generate().map_err(|source| Error::Certificate { what, source })
}

fn named(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

impl Pki {
    /// Generates everything for the cluster named `cluster`.
    pub(crate) fn generate(cluster: &str) -> Result<Self> {
        let cert_err = |what| move |source| Error::Certificate { what, source };

        let ca_key = key("CA key")?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = named(&format!("envtest CA for {cluster}"), None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(cert_err("CA certificate"))?;
        let ca = Issuer::new(ca_params, ca_key);

        let serving_key = key("serving key")?;
        let mut serving = CertificateParams::new(vec!["localhost".to_owned()])
            .map_err(cert_err("serving certificate"))?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving.distinguished_name = named("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving
            .signed_by(&serving_key, &ca)
            .map_err(cert_err("serving certificate"))?;

        // The API server takes the user from CN and the groups from O.
        let admin_key = key("admin client key")?;
        let mut admin = CertificateParams::default();
        admin.distinguished_name = named("envtest-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin
            .signed_by(&admin_key, &ca)
            .map_err(cert_err("admin client certificate"))?;

        let service_account = key("service-account signing key")?;

        Ok(Self {
            ca_cert: ca_cert.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            service_account_key: service_account.serialize_pem(),
            service_account_pub: service_account.public_key_pem(),
        })
    }
}

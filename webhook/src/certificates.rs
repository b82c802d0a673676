//! The serving certificate: read from files and read again when they
//! change, or made at start for development and tests.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::sync::watch;
use tokio_rustls::rustls::{
    crypto::ring::default_provider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

use crate::error::Error;

/// How often files are read again by default.
pub const DEFAULT_RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Where the webhook server's certificate comes from.
///
/// - [`Certificates::files`]: a certificate chain and its key in PEM files,
///   such as the `tls.crt` and `tls.key` of a Secret that cert-manager
///   keeps and the Pod mounts. The files are read again every
///   [`reload_every`](Self::reload_every) and a changed pair is served from
///   the next TLS handshake on: connections open already keep theirs. A
///   certificate renewed by the same CA (cert-manager's renewal) fails no
///   request; a new CA is written into every registration, and a cluster
///   refuses the new certificate until its registration is written again.
///   A pair that cannot be read or does not match is logged and reported,
///   and the last good pair goes on being served.
/// - [`Certificates::generate`]: a CA and a certificate it signs, made as
///   the server starts, for the addresses the registrations name. For
///   development and tests: each start makes a new CA, written into the
///   registrations.
///
/// The CA bundle written into the registrations (`caBundle`) is the
/// [`ca_file`](Self::ca_file) (cert-manager's `ca.crt`), else the
/// certificate file's whole chain.
///
/// ```
/// use kube_multicluster_webhook::Certificates;
///
/// let mounted = Certificates::files("/tls/tls.crt", "/tls/tls.key").ca_file("/tls/ca.crt");
/// let made = Certificates::generate();
/// # let _ = (mounted, made);
/// ```
#[derive(Clone, Debug)]
pub struct Certificates {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Files {
        cert: PathBuf,
        key: PathBuf,
        ca: Option<PathBuf>,
        every: Duration,
    },
    Generated {
        hosts: Vec<String>,
    },
}

impl Certificates {
    /// The PEM certificate chain in `cert` (the serving certificate first)
    /// and its PEM private key in `key`.
    pub fn files(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            source: Source::Files {
                cert: cert.into(),
                key: key.into(),
                ca: None,
                every: DEFAULT_RELOAD_EVERY,
            },
        }
    }

    /// The PEM CA bundle written into the registrations, read (and read
    /// again) beside the certificate. Without it, the certificate file's
    /// chain is written.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        if let Source::Files { ca, .. } = &mut self.source {
            *ca = Some(path.into());
        }
        self
    }

    /// How often the files are read again ([`DEFAULT_RELOAD_EVERY`]).
    pub fn reload_every(mut self, interval: Duration) -> Self {
        if let Source::Files { every, .. } = &mut self.source {
            *every = interval.max(Duration::from_millis(10));
        }
        self
    }

    /// A CA and a certificate it signs, made at start, valid for
    /// `localhost`, `127.0.0.1`, the host of the members' URL and the
    /// Service's DNS names, and any [`host`](Self::host) added.
    pub fn generate() -> Self {
        Self {
            source: Source::Generated { hosts: Vec::new() },
        }
    }

    /// One more DNS name or IP address the generated certificate is valid
    /// for.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        if let Source::Generated { hosts } = &mut self.source {
            hosts.push(host.into());
        }
        self
    }

    /// Whether the certificate is made at start ([`generate`](Self::generate)):
    /// each process then has a CA of its own, which suits one replica only.
    pub fn is_generated(&self) -> bool {
        matches!(self.source, Source::Generated { .. })
    }

    /// Reads or makes the first certificate; `hosts` are the names the
    /// registrations use, for a generated one.
    pub(crate) fn load(&self, hosts: &[String]) -> Result<Loaded, Error> {
        let (key, ca) = match &self.source {
            Source::Files { cert, key, ca, .. } => {
                if ca.is_none() {
                    tracing::warn!(
                        cert = %cert.display(),
                        "no CA file for the webhook certificate: its own chain is written into the registrations, so a renewed certificate is refused by each cluster until its registration is written again; give the CA (cert-manager's ca.crt) with Certificates::ca_file"
                    );
                }
                read_files(cert, key, ca.as_deref())?
            }
            Source::Generated { hosts: extra } => {
                let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
                for host in hosts.iter().chain(extra) {
                    if !names.contains(host) {
                        names.push(host.clone());
                    }
                }
                generate(&names)?
            }
        };
        Ok(Loaded::new(key, ca))
    }

    /// Reads the files again every interval while `loaded` is in use, and
    /// serves a changed pair once it checks out. `None` for a generated
    /// certificate, which never changes.
    pub(crate) fn reload(
        &self,
        loaded: Arc<Loaded>,
        problem: impl Fn(Option<&Error>) + Send + 'static,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let Source::Files {
            cert,
            key,
            ca,
            every,
        } = self.source.clone()
        else {
            return None;
        };
        Some(async move {
            let mut last = fingerprint(&cert, &key, ca.as_deref());
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval.tick().await;
            loop {
                interval.tick().await;
                let now = fingerprint(&cert, &key, ca.as_deref());
                if now == last {
                    continue;
                }
                last = now;
                match read_files(&cert, &key, ca.as_deref()) {
                    Ok((certified, bundle)) => {
                        tracing::info!(cert = %cert.display(), "serving the webhook certificate read again");
                        loaded.replace(certified, bundle);
                        problem(None);
                    }
                    // A pair being written is read again on the next tick;
                    // until it reads, the last good one is served.
                    Err(error) => {
                        tracing::warn!(%error, "the webhook certificate files changed but cannot be served; serving the previous ones");
                        problem(Some(&error));
                    }
                }
            }
        })
    }
}

/// The certificate served now, and the CA bundle for the registrations.
pub(crate) struct Loaded {
    key: RwLock<Arc<CertifiedKey>>,
    ca: watch::Sender<Arc<str>>,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded").finish_non_exhaustive()
    }
}

impl Loaded {
    fn new(key: CertifiedKey, ca: String) -> Self {
        Self {
            key: RwLock::new(Arc::new(key)),
            ca: watch::Sender::new(ca.into()),
        }
    }

    fn replace(&self, key: CertifiedKey, ca: String) {
        *self.key.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        self.ca.send_if_modified(|current| {
            if **current == *ca {
                return false;
            }
            *current = ca.into();
            true
        });
    }

    /// The CA bundle (PEM) now, and each change after.
    pub(crate) fn ca_bundle(&self) -> watch::Receiver<Arc<str>> {
        self.ca.subscribe()
    }

    /// The certificate chain served now (DER, the serving one first).
    pub(crate) fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.key
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .cert
            .clone()
    }
}

/// Serves whatever is loaded at the moment of each handshake.
#[derive(Debug)]
pub(crate) struct Resolver(pub(crate) Arc<Loaded>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.key.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn read_files(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<(CertifiedKey, String), Error> {
    let bad = |path: &Path, reason: String| Error::Certificate {
        path: path.to_owned(),
        reason,
    };
    let cert_pem = std::fs::read(cert).map_err(|e| bad(cert, e.to_string()))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(bad(cert, "holds no PEM certificate".into()));
    }
    let key_pem = std::fs::read(key).map_err(|e| bad(key, e.to_string()))?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
    let certified = CertifiedKey::from_der(chain, private, &default_provider()).map_err(|e| {
        bad(
            key,
            format!("does not serve the certificate in {}: {e}", cert.display()),
        )
    })?;
    let ca = match ca {
        Some(path) => {
            let pem = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
            let count = CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(path, format!("not a PEM CA bundle: {e}")))?
                .len();
            if count == 0 {
                return Err(bad(path, "holds no PEM certificate".into()));
            }
            pem
        }
        None => String::from_utf8_lossy(&cert_pem).into_owned(),
    };
    Ok((certified, ca))
}

/// What changes when a file is written: its length and modification time,
/// or its contents (for files replaced within one clock tick).
fn fingerprint(cert: &Path, key: &Path, ca: Option<&Path>) -> Vec<Option<Vec<u8>>> {
    [Some(cert), Some(key), ca]
        .into_iter()
        .flatten()
        .map(|path| std::fs::read(path).ok())
        .collect()
}

fn generate(hosts: &[String]) -> Result<(CertifiedKey, String), Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };

    let failed = |e: rcgen::Error| Error::Generate(e.to_string());
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-multicluster webhook CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(failed)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(failed)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::default();
    for host in hosts {
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.clone()
                    .try_into()
                    .map_err(|e: rcgen::Error| Error::Generate(format!("{host:?}: {e}")))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-multicluster webhook server");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(failed)?;
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    let private =
        PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| Error::Generate(e.to_string()))?;
    let certified = CertifiedKey::from_der(vec![cert.der().clone()], private, &default_provider())
        .map_err(|e| Error::Generate(e.to_string()))?;
    Ok((certified, ca_cert.pem()))
}

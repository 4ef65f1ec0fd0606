//! The PEM files of TLS, read one way for every side: the TLS listener's
//! certificate, key and client CA (`[server]`), a target's CA and client
//! certificate (`[[target]]`), and the `--ca`/`--client-cert`/`--client-key`
//! flags of `send` and `bench`. Here too: the error that names the key (or
//! flag), the file and the problem, the one crypto provider (ring, never a
//! process default) and the protocol versions (TLS 1.3 and 1.2).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ConfigBuilder, RootCertStore, SupportedProtocolVersion, WantsVerifier};

/// A certificate, key or CA file that cannot be used, or TLS settings the TLS
/// library refused. Each file error names the config key (or flag) and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("{key} ({}): cannot read it: {source}", file.display())]
    Read {
        key: &'static str,
        file: PathBuf,
        source: io::Error,
    },
    #[error("{key} ({}): not a usable PEM file: {reason}", file.display())]
    BadPem {
        key: &'static str,
        file: PathBuf,
        reason: String,
    },
    #[error("{key} ({}): no PEM certificate in it", file.display())]
    NoCertificate { key: &'static str, file: PathBuf },
    #[error("{key} ({}): no PEM private key (PKCS#8, RSA or EC) in it", file.display())]
    NoKey { key: &'static str, file: PathBuf },
    /// A certificate of a CA file (1-based `index`) that cannot be a trust anchor.
    #[error("{key} ({}): certificate {index} cannot be a trust anchor: {reason}", file.display())]
    BadCa {
        key: &'static str,
        file: PathBuf,
        index: usize,
        reason: String,
    },
    /// A certificate whose PEM holds something TLS cannot read as one.
    #[error("{key} ({}): not a usable certificate: {reason}", file.display())]
    BadCertificate {
        key: &'static str,
        file: PathBuf,
        reason: String,
    },
    /// A key whose PEM holds something TLS cannot read as a private key.
    #[error("{key} ({}): not a usable private key: {reason}", file.display())]
    BadKey {
        key: &'static str,
        file: PathBuf,
        reason: String,
    },
    /// A key that does not go with its certificate (boxed: the error stays small).
    #[error(transparent)]
    KeyMismatch(Box<KeyMismatch>),
    /// A key TLS needs is not set (config validation refuses this first).
    #[error("{key} is not set and TLS needs it")]
    Unset { key: &'static str },
    /// The TLS library refused the settings themselves (not a file).
    #[error("the TLS settings were refused: {0}")]
    Setup(String),
}

/// The key file of `key` does not go with the certificate file of `cert_key`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{key} ({}) does not go with {cert_key} ({}): {reason}",
    file.display(),
    cert_file.display()
)]
pub struct KeyMismatch {
    pub key: &'static str,
    pub file: PathBuf,
    pub cert_key: &'static str,
    pub cert_file: PathBuf,
    pub reason: String,
}

/// The one crypto provider of the tree (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The protocol versions spoken on both sides: TLS 1.3 and 1.2 (rustls has
/// nothing older).
pub const VERSIONS: &[&SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// A client config builder with [`provider`] and [`VERSIONS`].
pub fn client_builder() -> Result<ConfigBuilder<rustls::ClientConfig, WantsVerifier>, TlsFileError>
{
    rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| TlsFileError::Setup(e.to_string()))
}

/// A server config builder with [`provider`] and [`VERSIONS`].
pub fn server_builder() -> Result<ConfigBuilder<rustls::ServerConfig, WantsVerifier>, TlsFileError>
{
    rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| TlsFileError::Setup(e.to_string()))
}

/// The bytes of `file` (the value of `key`).
pub fn read(key: &'static str, file: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(file).map_err(|source| TlsFileError::Read {
        key,
        file: file.to_path_buf(),
        source,
    })
}

fn bad_pem(key: &'static str, file: &Path, e: pem::Error) -> TlsFileError {
    TlsFileError::BadPem {
        key,
        file: file.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Every certificate of the PEM text `pem` read from `file`, in order; none
/// is an error.
pub fn certificates(
    key: &'static str,
    file: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(key, file, e))?;
    if certs.is_empty() {
        return Err(TlsFileError::NoCertificate {
            key,
            file: file.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The private key of the PEM text `pem` read from `file`.
pub fn private_key(
    key: &'static str,
    file: &Path,
    pem: &[u8],
) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsFileError::NoKey {
            key,
            file: file.to_path_buf(),
        },
        e => bad_pem(key, file, e),
    })
}

/// The certificates of the PEM text `pem` read from `file`, as trust anchors.
pub fn trust_anchors(
    key: &'static str,
    file: &Path,
    pem: &[u8],
) -> Result<RootCertStore, TlsFileError> {
    let mut store = RootCertStore::empty();
    for (i, cert) in certificates(key, file, pem)?.into_iter().enumerate() {
        store.add(cert).map_err(|e| TlsFileError::BadCa {
            key,
            file: file.to_path_buf(),
            index: i + 1,
            reason: certificate_problem(&e),
        })?;
    }
    Ok(store)
}

/// Every certificate of a PEM file.
pub fn read_certs(
    key: &'static str,
    file: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    certificates(key, file, &read(key, file)?)
}

/// The private key of a PEM file.
pub fn read_key(key: &'static str, file: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    private_key(key, file, &read(key, file)?)
}

/// The certificates of a PEM file as trust anchors.
pub fn read_roots(key: &'static str, file: &Path) -> Result<RootCertStore, TlsFileError> {
    trust_anchors(key, file, &read(key, file)?)
}

/// What is wrong with a certificate rustls refused, in the operator's words:
/// rustls says "invalid peer certificate" of any certificate, the hub's own
/// and a CA's too.
fn certificate_problem(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding) => {
            "its DER does not parse as an X.509 certificate".to_string()
        }
        rustls::Error::InvalidCertificate(c) => format!("{c:?}"),
        e => e.to_string(),
    }
}

/// Why rustls refused the key of `key_file` with the certificate of
/// `cert_file`, naming the file at fault: the certificate when it does not
/// parse, the key when it does not (PEM armour around something else), else
/// the pair (most often: it is another certificate's key).
pub fn key_mismatch(
    (key, key_file): (&'static str, &Path),
    (cert_key, cert_file): (&'static str, &Path),
    e: rustls::Error,
) -> TlsFileError {
    match &e {
        rustls::Error::InconsistentKeys(_) => {}
        rustls::Error::InvalidCertificate(_) => {
            return TlsFileError::BadCertificate {
                key: cert_key,
                file: cert_file.to_path_buf(),
                reason: certificate_problem(&e),
            };
        }
        // rustls loads the private key before it looks at the
        // certificate: what else it refuses is the key itself.
        _ => {
            return TlsFileError::BadKey {
                key,
                file: key_file.to_path_buf(),
                reason: e.to_string(),
            };
        }
    }
    TlsFileError::KeyMismatch(Box::new(KeyMismatch {
        key,
        file: key_file.to_path_buf(),
        cert_key,
        cert_file: cert_file.to_path_buf(),
        reason: match e {
            rustls::Error::InconsistentKeys(_) => {
                "the key does not belong to the certificate".to_string()
            }
            e => e.to_string(),
        },
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A CA, a leaf it signs and the leaf's key, and another key, as PEM
    /// files in `dir`: (ca.pem, leaf.pem, leaf.key, other.key).
    pub(crate) fn pem_files(dir: &Path) -> [PathBuf; 4] {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["relayhub.test".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let other = KeyPair::generate().unwrap();
        let files = ["ca.pem", "leaf.pem", "leaf.key", "other.key"].map(|f| dir.join(f));
        std::fs::write(&files[0], issuer.pem()).unwrap();
        std::fs::write(&files[1], leaf.pem()).unwrap();
        std::fs::write(&files[2], key.serialize_pem()).unwrap();
        std::fs::write(&files[3], other.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn each_bad_file_names_its_key_its_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let [ca, leaf, leaf_key, other] = pem_files(dir.path());
        let text = |e: TlsFileError| e.to_string();

        let missing = dir.path().join("missing.pem");
        let t = text(read_certs("ca_file", &missing).unwrap_err());
        assert!(
            t.starts_with("ca_file (") && t.contains("missing.pem") && t.contains("cannot read"),
            "{t}"
        );

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "this is not a certificate\n").unwrap();
        let t = text(read_roots("server.tls_client_ca_file", &garbage).unwrap_err());
        assert!(
            t.starts_with("server.tls_client_ca_file (")
                && t.contains("garbage.pem")
                && t.contains("no PEM certificate"),
            "{t}"
        );

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let t = text(read_certs("--ca", &broken).unwrap_err());
        assert!(
            t.contains("broken.pem") && t.contains("not a usable PEM file"),
            "{t}"
        );

        // A certificate is no key.
        let t = text(read_key("client_key_file", &ca).unwrap_err());
        assert!(t.contains("no PEM private key"), "{t}");

        // A key that is not the certificate's.
        let certs = read_certs("server.tls_cert_file", &leaf).unwrap();
        let e = server_builder()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs.clone(), read_key("k", &other).unwrap())
            .unwrap_err();
        let t = text(key_mismatch(
            ("server.tls_key_file", &other),
            ("server.tls_cert_file", &leaf),
            e,
        ));
        assert!(
            t.starts_with("server.tls_key_file (")
                && t.contains("other.key")
                && t.contains("does not go with server.tls_cert_file (")
                && t.contains("leaf.pem")
                && t.contains("the key does not belong to the certificate"),
            "{t}"
        );
        // PEM armour around something else: the file at fault is named,
        // and no "peer" (rustls's word for any certificate it refuses).
        let junk = |name: &str, label: &str| {
            let path = dir.path().join(name);
            std::fs::write(
                &path,
                format!("-----BEGIN {label}-----\nZ2FyYmFnZQ==\n-----END {label}-----\n"),
            )
            .unwrap();
            path
        };
        let junk_cert = junk("junk.pem", "CERTIFICATE");
        let e = server_builder()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                read_certs("c", &junk_cert).unwrap(),
                read_key("k", &leaf_key).unwrap(),
            )
            .unwrap_err();
        let t = text(key_mismatch(
            ("server.tls_key_file", &leaf_key),
            ("server.tls_cert_file", &junk_cert),
            e,
        ));
        assert!(
            t.starts_with("server.tls_cert_file (")
                && t.contains("junk.pem): not a usable certificate: its DER does not parse")
                && !t.contains("peer")
                && !t.contains("leaf.key"),
            "{t}"
        );
        let junk_key = junk("junk.key", "PRIVATE KEY");
        let e = server_builder()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs.clone(), read_key("k", &junk_key).unwrap())
            .unwrap_err();
        let t = text(key_mismatch(
            ("client_key_file", &junk_key),
            ("client_cert_file", &leaf),
            e,
        ));
        assert!(
            t.starts_with("client_key_file (")
                && t.contains("junk.key): not a usable private key: ")
                && !t.contains("does not go with"),
            "{t}"
        );
        let t = text(read_roots("ca_file", &junk_cert).unwrap_err());
        assert!(
            t.contains("junk.pem): certificate 1 cannot be a trust anchor: its DER does not parse")
                && !t.contains("peer"),
            "{t}"
        );
        // Its own key goes with it.
        server_builder()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, read_key("k", &leaf_key).unwrap())
            .unwrap();
        assert_eq!(read_roots("ca_file", &ca).unwrap().len(), 1);
    }
}

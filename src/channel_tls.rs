//! TLS on the channel side: the listener's rustls configuration, built from
//! the PEM files named in `[server]` (read by [`crate::tls_files`]) and
//! rebuilt on SIGHUP; why a handshake failed; and the names a channel's
//! client certificate bears.
//!
//! Inside TLS the framing is the same: the server hands the decrypted stream
//! to the same connection handling as a plain one.

use std::sync::{Arc, RwLock};

use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;

use crate::config::{ClientAuth, ServerConfig};
use crate::rules::ClientCert;
use crate::tls_files::{self, TlsFileError};

/// The listener's configuration from the `tls_*` keys of `[server]`:
/// certificate chain and key (which must match), client-certificate
/// verification when `tls_client_ca_file` is set, TLS 1.2 and 1.3 only.
pub fn server_config(s: &ServerConfig) -> Result<Arc<rustls::ServerConfig>, TlsFileError> {
    const CERT: &str = "server.tls_cert_file";
    const KEY: &str = "server.tls_key_file";
    let cert_file = s
        .tls_cert_file
        .as_deref()
        .ok_or(TlsFileError::Unset { key: CERT })?;
    let key_file = s
        .tls_key_file
        .as_deref()
        .ok_or(TlsFileError::Unset { key: KEY })?;
    let certs = tls_files::read_certs(CERT, cert_file)?;
    let key = tls_files::read_key(KEY, key_file)?;
    let builder = tls_files::server_builder()?;
    let builder = match &s.tls_client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let roots = tls_files::read_roots("server.tls_client_ca_file", ca_file)?;
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), tls_files::provider());
            let verifier = match s.tls_client_auth {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsFileError::Setup(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| tls_files::key_mismatch((KEY, key_file), (CERT, cert_file), e))?;
    Ok(Arc::new(config))
}

/// The TLS configuration in force: each new connection takes the current one;
/// a reload replaces it and open connections keep theirs.
pub struct Acceptor {
    config: RwLock<Arc<rustls::ServerConfig>>,
}

impl Acceptor {
    pub fn new(config: Arc<rustls::ServerConfig>) -> Acceptor {
        Acceptor {
            config: RwLock::new(config),
        }
    }

    /// An acceptor for the next connection.
    pub fn current(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }

    /// From now on, new connections get `config`.
    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
    }
}

/// Why a handshake failed: the `reason` label of
/// [`crate::metric_names::TLS_HANDSHAKE_FAILURES`] and a sentence for the log.
pub fn failure(e: &std::io::Error) -> (&'static str, String) {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::NoCertificatesPresented) => (
            "no_client_certificate",
            "the client presented no certificate and one is required".into(),
        ),
        Some(rustls::Error::InvalidCertificate(why)) => (
            "bad_client_certificate",
            // rustls' own words: "certificate expired: verification time
            // ... (N seconds ago)", or the variant's name where it has none.
            format!("the client certificate was refused: {why}"),
        ),
        Some(other) => ("protocol", format!("TLS error: {other}")),
        None => ("closed", format!("the client went away: {e}")),
    }
}

/// The names a verified client certificate bears: its SAN DNS names, then
/// its subject CN, lowercased. `None` without a certificate.
pub fn client_cert(chain: Option<&[CertificateDer<'_>]>) -> Option<ClientCert> {
    let leaf = chain?.first()?;
    let mut names = Vec::new();
    if let Ok(cert) = webpki::EndEntityCert::try_from(leaf) {
        names.extend(cert.valid_dns_names().map(str::to_ascii_lowercase));
        if let Some(cn) = common_name(cert.subject()) {
            let cn = cn.to_ascii_lowercase();
            if !names.contains(&cn) {
                names.push(cn);
            }
        }
    }
    Some(ClientCert { names })
}

/// One DER element at the start of `der`: (tag, contents, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (n as usize, rest),
        0x81 => (*rest.first()? as usize, rest.get(1..)?),
        0x82 => (
            u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize,
            rest.get(2..)?,
        ),
        _ => return None,
    };
    let contents = rest.get(..len)?;
    Some((tag, contents, rest.get(len..)?))
}

/// The first common name (OID 2.5.4.3) of an X.509 Name's contents
/// (a SEQUENCE OF SET OF AttributeTypeAndValue), when it is text.
fn common_name(mut name: &[u8]) -> Option<String> {
    const CN: [u8; 3] = [0x55, 0x04, 0x03];
    while !name.is_empty() {
        let (tag, mut set, rest) = der_element(name)?;
        name = rest;
        if tag != 0x31 {
            continue;
        }
        while !set.is_empty() {
            let (_, atv, rest) = der_element(set)?;
            set = rest;
            let (oid_tag, oid, value) = der_element(atv)?;
            if oid_tag != 0x06 || oid != CN {
                continue;
            }
            let (value_tag, text, _) = der_element(value)?;
            // UTF8String, PrintableString, IA5String, T61String.
            if matches!(value_tag, 0x0c | 0x13 | 0x16 | 0x14) {
                return std::str::from_utf8(text).ok().map(str::to_string);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_name_is_read_from_a_name() {
        // SET { SEQUENCE { OID 2.5.4.6, PrintableString "KR" } },
        // SET { SEQUENCE { OID 2.5.4.3, UTF8String "ibank.channel" } }
        let mut name = vec![
            0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x06, 0x13, 0x02,
        ];
        name.extend_from_slice(b"KR");
        name.extend_from_slice(&[
            0x31, 0x16, 0x30, 0x14, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x0d,
        ]);
        name.extend_from_slice(b"ibank.channel");
        assert_eq!(common_name(&name).as_deref(), Some("ibank.channel"));
        assert_eq!(common_name(&name[..11]), None);
        // Truncated input: no name, no panic.
        for n in 0..name.len() {
            let _ = common_name(&name[..n]);
        }
    }
}

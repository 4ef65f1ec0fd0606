//! Test certificates, made at test time with rcgen: a CA of the test's own and
//! leaf certificates it signs (server or client, valid, expired or for another
//! name), written as PEM files into a [`TempDir`]. No private key is committed.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

use super::TempDir;

/// A certificate authority that lives as long as the test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: TempDir,
    /// The CA's certificate, PEM: what a peer trusts.
    pub cert: PathBuf,
}

/// A leaf certificate and its key, as PEM files.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a leaf is for and whether it is in date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid from 1975 to 4096.
    Current,
    /// Valid only in 2020: expired today.
    Expired,
}

impl TestCa {
    /// A new CA whose common name is `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signed ca");
        let dir = TempDir::new("certs");
        let cert = dir.join("ca.pem");
        std::fs::write(&cert, issuer.pem()).expect("write ca.pem");
        TestCa { issuer, dir, cert }
    }

    /// A server certificate for `names` (DNS names or IP addresses), saved as
    /// `{file}.pem` and `{file}.key` beside the CA.
    pub fn server(&self, file: &str, names: &[&str], validity: Validity) -> Leaf {
        self.leaf(
            file,
            names,
            names.first().copied().unwrap_or("server"),
            validity,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose common name is `cn` and whose SANs are
    /// `names`, saved as `{file}.pem` and `{file}.key`.
    pub fn client(&self, file: &str, cn: &str, names: &[&str], validity: Validity) -> Leaf {
        self.leaf(
            file,
            names,
            cn,
            validity,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(
        &self,
        file: &str,
        names: &[&str],
        cn: &str,
        validity: Validity,
        usage: ExtendedKeyUsagePurpose,
    ) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if validity == Validity::Expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2020, 12, 31);
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf");
        let leaf = Leaf {
            cert: self.dir.join(&format!("{file}.pem")),
            key: self.dir.join(&format!("{file}.key")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write leaf cert");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write leaf key");
        leaf
    }
}

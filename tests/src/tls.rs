//! Test PKI for the TLS suites: a CA and a server certificate it signed
//! (rcgen), as PEM strings, written where a test needs files.

use std::path::{Path, PathBuf};

/// A CA and a server certificate it signed.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// The server certificate (PEM).
    pub cert_pem: String,
    /// The server key (PEM).
    pub key_pem: String,
}

/// A CA named `ca_name` and a server certificate for `127.0.0.1` and
/// `localhost`.
pub fn pki(ca_name: &str) -> Pki {
    pki_for(ca_name, &["localhost", "127.0.0.1"])
}

/// A CA named `ca_name` and a server certificate for `names` (DNS names
/// or IP addresses).
pub fn pki_for(ca_name: &str, names: &[&str]) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
        .expect("ca cert");
    let key = KeyPair::generate().expect("server key");
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, format!("broker of {ca_name}"));
    let cert = params.signed_by(&key, &ca).expect("server cert");
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// The files of a [`Pki`] in a directory.
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// CA certificate.
    pub ca: PathBuf,
    /// Server certificate.
    pub cert: PathBuf,
    /// Server key.
    pub key: PathBuf,
}

impl Pki {
    /// Writes `<prefix>-ca.pem`, `<prefix>-cert.pem`, `<prefix>-key.pem` in `dir`.
    pub fn write(&self, dir: &Path, prefix: &str) -> PkiFiles {
        let f = PkiFiles {
            ca: dir.join(format!("{prefix}-ca.pem")),
            cert: dir.join(format!("{prefix}-cert.pem")),
            key: dir.join(format!("{prefix}-key.pem")),
        };
        std::fs::write(&f.ca, &self.ca_pem).expect("write ca");
        std::fs::write(&f.cert, &self.cert_pem).expect("write cert");
        std::fs::write(&f.key, &self.key_pem).expect("write key");
        f
    }
}

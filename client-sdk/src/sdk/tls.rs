//! TLS for `pulsar+ssl://` service URLs (rustls through tokio-rustls, the
//! aws-lc-rs provider, as the broker uses).
//!
//! [`TlsOptions`] are the client's settings, named as Pulsar clients name
//! them: a trust file (PEM CA bundle; without one the system's roots),
//! `allow_insecure_connection` (accept any server certificate; off by
//! default) and `validate_hostname` (on by default: the certificate must
//! name the host the client connects to). [`client_config`] turns them into
//! one rustls configuration, built when the client is built, so a trust
//! file that does not load is an error then, not at the first connection.
//! A handshake refused for a certificate is [`Error::Tls`], which is not
//! retried.

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::WebPkiServerVerifier,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};

use super::error::{Error, Result};

/// TLS settings of a client (see `ClientBuilder::tls_*`).
#[derive(Debug, Clone)]
pub(crate) struct TlsOptions {
    /// PEM file of the CAs the broker's certificate must chain to.
    pub(crate) trust_certs_file: Option<PathBuf>,
    /// Accept any server certificate (testing only).
    pub(crate) allow_insecure_connection: bool,
    /// The certificate must name the host connected to.
    pub(crate) validate_hostname: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            trust_certs_file: None,
            allow_insecure_connection: false,
            validate_hostname: true,
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn roots(opts: &TlsOptions) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match &opts.trust_certs_file {
        Some(path) => {
            let bad = |reason: String| Error::Tls {
                addr: path.display().to_string(),
                reason,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| bad(format!("trust certificates file: {e}")))?;
            if certs.is_empty() {
                return Err(bad("trust certificates file holds no certificate".into()));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| bad(format!("trust certificates file: {e}")))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(Error::Tls {
                    addr: "system trust store".into(),
                    reason: "no CA certificates found; set tls_trust_certs_file".into(),
                });
            }
        }
    }
    Ok(roots)
}

/// The rustls client configuration for `opts`.
pub(crate) fn client_config(opts: &TlsOptions) -> Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls {
            addr: String::new(),
            reason: e.to_string(),
        })?;
    let config = if opts.allow_insecure_connection {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider())))
            .with_no_client_auth()
    } else {
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots(opts)?), provider())
                .build()
                .map_err(|e| Error::Tls {
                    addr: String::new(),
                    reason: e.to_string(),
                })?;
        if opts.validate_hostname {
            builder.with_webpki_verifier(webpki).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                .with_no_client_auth()
        }
    };
    Ok(Arc::new(config))
}

/// The name to verify for `host` (an IP address or a DNS name).
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).map_err(|e| Error::Tls {
        addr: host.to_owned(),
        reason: format!("not a valid TLS server name: {e}"),
    })
}

/// Chain verified against the roots; the name is not checked
/// (`validate_hostname(false)`).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Any certificate (`allow_insecure_connection(true)`); the handshake
/// signatures are still checked, so the peer holds the certificate's key.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_trust_file_is_a_tls_error() {
        let d = std::env::temp_dir().join(format!("cms-sdk-tls-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let missing = TlsOptions {
            trust_certs_file: Some(d.join("missing.pem")),
            ..TlsOptions::default()
        };
        assert!(matches!(client_config(&missing), Err(Error::Tls { .. })));
        let empty_file = d.join("empty.pem");
        std::fs::write(&empty_file, "").unwrap();
        let empty = TlsOptions {
            trust_certs_file: Some(empty_file),
            ..TlsOptions::default()
        };
        let e = client_config(&empty).unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        let insecure = TlsOptions {
            allow_insecure_connection: true,
            trust_certs_file: Some(d.join("missing.pem")),
            ..TlsOptions::default()
        };
        assert!(client_config(&insecure).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn server_names_for_ips_and_hosts() {
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("::1").is_ok());
        assert!(server_name("broker.example").is_ok());
        assert!(server_name("bad name!").is_err());
    }
}

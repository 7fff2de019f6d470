//! TLS to the database, with libpq's meaning of `sslmode`.
//!
//! - `disable`: plain TCP.
//! - `prefer` (the default) and `require`: encrypted when the server offers
//!   it (`require` refuses a server that does not), the certificate not
//!   checked: what libpq does, and what makes a stock server with a
//!   self-signed certificate work.
//! - `verify-ca` and `verify-full`: the certificate must chain to a trusted
//!   root (`sslrootcert=<file>`, else the public web roots) and name the
//!   host. Both check the name: the stricter reading of `verify-ca`.
//!
//! The driver knows only the first three modes, so the verifying ones (and
//! `sslrootcert`) are taken out of the connection string before it is
//! parsed and become this module's policy.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Result, StoreError};

/// Whether and how the server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Encrypt only (libpq's `prefer` and `require`).
    No,
    /// Chain to these roots (a PEM file) or, with `None`, the web roots.
    Roots(Option<PathBuf>),
}

/// Splits the verifying parts out of `url`: returns what the driver can
/// parse, and the verification policy.
pub(crate) fn split_policy(url: &str) -> (String, Verify) {
    let mut verify = false;
    let mut root: Option<PathBuf> = None;
    let mut keep = |key: &str, value: &str| -> Option<String> {
        match key {
            "sslmode" if value == "verify-ca" || value == "verify-full" => {
                verify = true;
                Some("require".to_owned())
            }
            "sslrootcert" => {
                root = Some(PathBuf::from(value));
                None
            }
            _ => Some(value.to_owned()),
        }
    };
    let cleaned = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let params: Vec<String> = query
                    .split('&')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| match p.split_once('=') {
                        Some((k, v)) => keep(k, v).map(|v| format!("{k}={v}")),
                        None => Some(p.to_owned()),
                    })
                    .collect();
                if params.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", params.join("&"))
                }
            }
        }
    } else {
        url.split(' ')
            .filter(|p| !p.is_empty())
            .filter_map(|p| match p.split_once('=') {
                Some((k, v)) => keep(k, v).map(|v| format!("{k}={v}")),
                None => Some(p.to_owned()),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let policy = if verify {
        Verify::Roots(root)
    } else {
        Verify::No
    };
    (cleaned, policy)
}

/// The connector for `policy`.
pub(crate) fn connector(policy: &Verify) -> Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Database(format!("cannot set up TLS: {e}")))?;
    let config = match policy {
        Verify::No => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly { provider }))
            .with_no_client_auth(),
        Verify::Roots(file) => {
            let mut roots = rustls::RootCertStore::empty();
            match file {
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
                Some(path) => {
                    let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                        StoreError::Database(format!(
                            "cannot read sslrootcert {}: {e}",
                            path.display()
                        ))
                    })?;
                    for cert in certs {
                        let cert = cert.map_err(|e| {
                            StoreError::Database(format!(
                                "cannot read sslrootcert {}: {e}",
                                path.display()
                            ))
                        })?;
                        roots.add(cert).map_err(|e| {
                            StoreError::Database(format!(
                                "sslrootcert {} holds an unusable certificate: {e}",
                                path.display()
                            ))
                        })?;
                    }
                }
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's `prefer`/`require`: any certificate is accepted, but the
/// handshake's signatures are still checked, so the session is encrypted
/// to whoever holds the certificate's key.
#[derive(Debug)]
struct EncryptOnly {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_modes_become_require_plus_a_policy() {
        assert_eq!(
            split_policy("postgres://u@h/db?sslmode=verify-full&sslrootcert=/etc/ca.pem"),
            (
                "postgres://u@h/db?sslmode=require".to_owned(),
                Verify::Roots(Some(PathBuf::from("/etc/ca.pem")))
            )
        );
        assert_eq!(
            split_policy("postgres://u@h/db?sslmode=verify-ca"),
            (
                "postgres://u@h/db?sslmode=require".to_owned(),
                Verify::Roots(None)
            )
        );
        assert_eq!(
            split_policy("host=h sslmode=verify-full dbname=x"),
            (
                "host=h sslmode=require dbname=x".to_owned(),
                Verify::Roots(None)
            )
        );
    }

    #[test]
    fn other_modes_pass_through_unverified() {
        for url in [
            "postgres://u@h/db",
            "postgres://u@h/db?sslmode=require",
            "postgres://u@h/db?sslmode=disable&application_name=x",
            "host=h user=u",
        ] {
            assert_eq!(split_policy(url), (url.to_owned(), Verify::No), "{url}");
        }
        // A root file alone does not turn verification on (libpq ignores
        // it below verify-ca too), but the driver must not see it.
        assert_eq!(
            split_policy("postgres://u@h/db?sslrootcert=/x.pem"),
            ("postgres://u@h/db".to_owned(), Verify::No)
        );
    }

    #[test]
    fn a_missing_root_file_is_a_clear_error() {
        let err = connector(&Verify::Roots(Some(PathBuf::from("/nonexistent/ca.pem"))))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
        assert!(connector(&Verify::No).is_ok());
        assert!(connector(&Verify::Roots(None)).is_ok());
    }
}

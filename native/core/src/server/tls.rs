//! TLS on the server's two sides, from PEM files: the ext_proc port Envoy connects to (mutual TLS when a
//! client CA is given), and the server's own calls to the engines (Abort, batched completions), which
//! verify the engine against a CA and may present a client certificate. rustls with the ring provider.

use std::io;
use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The ext_proc port over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The server's certificate chain and its private key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA bundle (mutual TLS); None: any client.
    pub client_ca: Option<PathBuf>,
}

/// The server's engine calls over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineTls {
    /// Engines' certificates must be signed by this CA bundle.
    pub ca: PathBuf,
    /// A client certificate and key to present (mutual TLS); both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name sent as SNI and checked in the engine's certificate; None: the engine's address.
    pub server_name: Option<String>,
}

fn read(path: &Path, what: &str) -> io::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display())))
}

impl ServerTls {
    pub fn config(&self) -> io::Result<ServerTlsConfig> {
        let identity = Identity::from_pem(read(&self.cert, "TLS certificate")?, read(&self.key, "TLS key")?);
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca, "TLS client CA")?));
        }
        Ok(config)
    }
}

impl EngineTls {
    pub fn config(&self) -> io::Result<ClientTlsConfig> {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca, "engine TLS CA")?));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let identity = Identity::from_pem(read(cert, "engine TLS certificate")?, read(key, "engine TLS key")?);
                config = config.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an engine TLS client certificate needs both the certificate and its key",
                ))
            }
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let tls = ServerTls {
            cert: PathBuf::from("/nonexistent/extproc.pem"),
            key: PathBuf::from("/nonexistent/extproc.key"),
            client_ca: None,
        };
        let error = tls.config().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(
            error.to_string().contains("TLS certificate /nonexistent/extproc.pem"),
            "{error}"
        );
    }

    #[test]
    fn an_engine_client_certificate_needs_its_key() {
        let dir = std::env::temp_dir().join(format!("extproc-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, b"not checked before the pair").unwrap();
        let tls = EngineTls {
            ca,
            cert: Some(dir.join("client.pem")),
            key: None,
            server_name: None,
        };
        let error = tls.config().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let _ = std::fs::remove_dir_all(dir);
    }
}

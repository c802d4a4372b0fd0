//! Where the server listens: "host:port" (port 0 picks a free one) or "unix:/path" ("unix:///path").

use std::io;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(String),
    Unix(PathBuf),
}

impl ListenAddr {
    pub fn parse(listen: &str) -> io::Result<Self> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("listen {listen:?}: {why}"));
        if let Some(rest) = listen.strip_prefix("unix:") {
            // "unix:///abs" and "unix:/abs" both name /abs.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(invalid("a unix socket needs an absolute path"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        match listen.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(ListenAddr::Tcp(listen.to_string()))
            }
            _ => Err(invalid("expected host:port or unix:/path")),
        }
    }
}

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Bind (inside a runtime); also returns the address clients should use, with the real port.
    pub fn bind(addr: &ListenAddr) -> io::Result<(Listener, String)> {
        match addr {
            ListenAddr::Tcp(hostport) => {
                // std resolves names and sets SO_REUSEADDR, as gRPC servers do.
                let std = std::net::TcpListener::bind(hostport.as_str())?;
                std.set_nonblocking(true)?;
                let port = std.local_addr()?.port();
                let host = hostport.rsplit_once(':').map(|(h, _)| h).unwrap_or_default();
                Ok((Listener::Tcp(TcpListener::from_std(std)?), format!("{host}:{port}")))
            }
            ListenAddr::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)?;
                Ok((
                    Listener::Unix(listener, path.clone()),
                    format!("unix:{}", path.display()),
                ))
            }
        }
    }
}

/// A socket file left by a server that died is in the way; anything else at that path is not ours.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            ListenAddr::parse("127.0.0.1:0").unwrap(),
            ListenAddr::Tcp("127.0.0.1:0".into())
        );
        assert_eq!(
            ListenAddr::parse("[::1]:50051").unwrap(),
            ListenAddr::Tcp("[::1]:50051".into())
        );
        assert_eq!(
            ListenAddr::parse("unix:/tmp/x.sock").unwrap(),
            ListenAddr::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            ListenAddr::parse("unix:///tmp/x.sock").unwrap(),
            ListenAddr::Unix("/tmp/x.sock".into())
        );
        for bad in ["", "50051", ":50051", "host:", "host:99999", "unix:relative.sock"] {
            assert!(ListenAddr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_stale_socket_is_replaced_but_a_regular_file_is_not() {
        let dir = std::env::temp_dir().join(format!("extproc-listen-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(remove_stale_socket(&sock).is_ok());
        assert!(!sock.exists());
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(remove_stale_socket(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

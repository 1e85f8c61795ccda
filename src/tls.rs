//! TLS for the gRPC and HTTP ports (rustls, TLS 1.2 and 1.3 only): the PEM files of
//! `server.tls_*`, re-read on SIGHUP and whenever they change, and an accept loop that hands
//! finished handshakes to the servers.
//!
//! A reload swaps the configuration new handshakes use; connections already open keep theirs,
//! so a certificate rotation (cert-manager writing new files) drops no call. A reload that
//! fails (a half-written file, a key that does not match) keeps the previous configuration and
//! says so in the log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig as ServerOptions;

/// Handshakes in progress at once per port; past it new connections wait in the kernel's
/// backlog, so a flood of idle connections cannot grow memory.
const HANDSHAKES_IN_PROGRESS_MAX: usize = 256;
/// Finished connections waiting for the server to take them.
const ACCEPTED_QUEUE_MAX: usize = 64;
/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {option} {path}: {source}")]
    Read { option: &'static str, path: String, source: std::io::Error },
    #[error("{option} {path} holds no {what}")]
    Empty { option: &'static str, path: String, what: &'static str },
    #[error("{option} {path} is not valid PEM: {detail}")]
    Pem { option: &'static str, path: String, detail: String },
    #[error("server.tls_cert_file and server.tls_key_file do not make a usable pair: {0}")]
    Pair(String),
    #[error("server.tls_client_ca_file: {0}")]
    ClientCa(String),
}

/// Which port a configuration is for: they differ in ALPN and in client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// HTTP/2 only; a client certificate when `tls_client_ca_file` is set.
    Grpc,
    /// HTTP/1.1; never a client certificate (Stripe's webhook calls have none).
    Http,
}

/// The three files of `server.tls_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// `None` when TLS is not configured (validated: both or neither of cert and key).
    pub fn from_config(server: &ServerOptions) -> Option<Self> {
        Some(Self {
            cert: server.tls_cert_file.clone()?,
            key: server.tls_key_file.clone()?,
            client_ca: server.tls_client_ca_file.clone(),
        })
    }

    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }

    /// Size and modification time of each file: a change of either triggers a reload.
    fn stamps(&self) -> Vec<Option<(u64, SystemTime)>> {
        self.paths()
            .map(|path| std::fs::metadata(path).ok().and_then(|meta| Some((meta.len(), meta.modified().ok()?))))
            .collect()
    }

    /// Reads and checks every file into a rustls configuration for `port`.
    pub fn load(&self, port: Port) -> Result<ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certificates = read_certificates("server.tls_cert_file", &self.cert)?;
        let key = read_key(&self.key)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| TlsError::Pair(error.to_string()))?;
        let builder = match (&self.client_ca, port) {
            (Some(client_ca), Port::Grpc) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in read_certificates("server.tls_client_ca_file", client_ca)? {
                    roots.add(certificate).map_err(|error| TlsError::ClientCa(error.to_string()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|error| TlsError::ClientCa(error.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_single_cert(certificates, key).map_err(|error| TlsError::Pair(error.to_string()))?;
        config.alpn_protocols = match port {
            Port::Grpc => vec![b"h2".to_vec()],
            Port::Http => vec![b"http/1.1".to_vec()],
        };
        Ok(config)
    }
}

fn read(option: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { option, path: path.display().to_string(), source })
}

fn read_certificates(option: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(option, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem { option, path: path.display().to_string(), detail: error.to_string() })?;
    if certificates.is_empty() {
        return Err(TlsError::Empty { option, path: path.display().to_string(), what: "CERTIFICATE block" });
    }
    Ok(certificates)
}

/// The key's bytes never reach an error or the log: only whether a key was found.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let option = "server.tls_key_file";
    let pem = read(option, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::Empty {
        option,
        path: path.display().to_string(),
        what: "PRIVATE KEY block (PKCS#8, PKCS#1 or SEC1)",
    })
}

/// The configuration new handshakes on one port use; swapped by [`Reloader`].
#[derive(Clone)]
pub struct CurrentConfig {
    port: Port,
    config: Arc<RwLock<Arc<ServerConfig>>>,
}

impl CurrentConfig {
    pub fn load(files: &TlsFiles, port: Port) -> Result<Self, TlsError> {
        Ok(Self { port, config: Arc::new(RwLock::new(Arc::new(files.load(port)?))) })
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.read().expect("never poisoned: writers do not panic").clone())
    }

    fn replace(&self, config: ServerConfig) {
        *self.config.write().expect("never poisoned: writers do not panic") = Arc::new(config);
    }
}

/// Re-reads the files every `interval` when they changed, and on SIGHUP whatever changed.
pub struct Reloader {
    files: TlsFiles,
    ports: Vec<CurrentConfig>,
    interval: Duration,
}

impl Reloader {
    pub fn new(files: TlsFiles, ports: Vec<CurrentConfig>, interval: Duration) -> Self {
        Self { files, ports, interval }
    }

    pub fn spawn(self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        // Registered before the task runs, so before `serve` says it is serving: a SIGHUP that
        // arrives before the handler exists would end the process (the default action).
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|error| tracing::warn!(%error, "cannot watch SIGHUP; TLS files are still re-read when they change"))
            .ok();
        let mut stamps = self.files.stamps();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(self.interval);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let hangup = async {
                    match hangups.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let forced = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = interval.tick() => false,
                    _ = hangup => true,
                };
                let now = self.files.stamps();
                if !forced && now == stamps {
                    continue;
                }
                stamps = now;
                self.reload();
            }
        })
    }

    fn reload(&self) {
        for port in &self.ports {
            match self.files.load(port.port) {
                Ok(config) => {
                    port.replace(config);
                    metrics::counter!("chargeguard_tls_reloads_total", "result" => "ok").increment(1);
                    tracing::info!(port = ?port.port, cert = %self.files.cert.display(), "TLS certificate files re-read; new connections use them");
                }
                Err(error) => {
                    metrics::counter!("chargeguard_tls_reloads_total", "result" => "failed").increment(1);
                    tracing::warn!(port = ?port.port, %error, "TLS certificate files not re-read; the previous certificate stays in use");
                }
            }
        }
    }
}

/// A TLS connection whose handshake finished, and its peer.
pub type Accepted = (TlsStream<TcpStream>, SocketAddr);

/// Accepts on `listener` and hands each finished handshake to the returned channel. Each
/// handshake runs in its own task, bounded in number and in time, so a slow or silent client
/// never holds up the others.
pub fn accept_loop(
    listener: TcpListener,
    config: CurrentConfig,
    handshake_timeout: Duration,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Accepted> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_QUEUE_MAX);
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_PROGRESS_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(place) = handshakes.clone().acquire_owned().await else { return };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sender.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            // Nagle's algorithm with delayed ACKs adds ~40 ms to small replies.
            let _ = tcp.set_nodelay(true);
            let acceptor = config.acceptor();
            let sender = sender.clone();
            tokio::spawn(async move {
                let _place = place;
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = sender.send((stream, peer)).await;
                    }
                    Ok(Err(error)) => {
                        metrics::counter!("chargeguard_tls_handshake_failures_total", "reason" => "refused").increment(1);
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                    }
                    Err(_) => {
                        metrics::counter!("chargeguard_tls_handshake_failures_total", "reason" => "timeout").increment(1);
                        tracing::debug!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    receiver
}

/// The HTTP port's TLS connections, for `axum::serve`.
pub struct HttpsListener {
    accepted: mpsc::Receiver<Accepted>,
    local_addr: SocketAddr,
}

impl HttpsListener {
    pub fn new(accepted: mpsc::Receiver<Accepted>, local_addr: SocketAddr) -> Self {
        Self { accepted, local_addr }
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept loop stops only at shutdown, when the server stops asking too.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

/// The client side, for the CLI and the load generator: `--ca-file` trusts a private CA (else
/// the system's web roots), `--cert-file` and `--key-file` present a client certificate.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// PEM CA certificate(s) that signed the server's certificate; turns TLS on.
    #[arg(long, env = "CHARGEGUARD_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a server that asks for one (mutual TLS); needs --key-file.
    #[arg(long, env = "CHARGEGUARD_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of --cert-file. Never printed.
    #[arg(long, env = "CHARGEGUARD_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// Whether TLS is asked for (a file, or an `https://` server URL).
    pub fn wanted(&self, server_url: &str) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || server_url.starts_with("https://")
    }

    /// tonic's client TLS configuration; errors name the flag and the file, never a key's bytes.
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        let read = |flag: &str, path: &Path| {
            std::fs::read(path).map_err(|error| format!("cannot read {flag} {}: {error}", path.display()))
        };
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &self.ca_file {
            Some(path) => config.ca_certificate(tonic::transport::Certificate::from_pem(read("--ca-file", path)?)),
            None => config.with_webpki_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            config = config.identity(tonic::transport::Identity::from_pem(read("--cert-file", cert)?, read("--key-file", key)?));
        }
        Ok(config)
    }
}

//! Security (issue 18): TLS and mutual TLS with certificates made in the test (rcgen), token
//! rotation, per-consumer limits, hostile input, and a secrets audit of a real server's log.

mod hangup;
mod hostile;
mod limits;
mod plaintext;
mod secrets;
mod tls;
mod tokens;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use chargeguard::grpc::proto::payments_client::PaymentsClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// The name the server's certificates are issued for, and that clients check.
pub const SERVER_NAME: &str = "localhost";

/// A certificate authority of the test's own.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM, and the certificate's DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        Self { pem: certificate.pem(), issuer: Issuer::new(params, key) }
    }

    pub fn server(&self) -> Issued {
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, SERVER_NAME);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    pub fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    /// A client certificate with `common_name` and a URI subject alternative name (a SPIFFE
    /// ID, as a service mesh issues them).
    pub fn client_with_uri(&self, common_name: &str, uri: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.subject_alt_names = vec![rcgen::SanType::URI(uri.try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, mut params: CertificateParams) -> Issued {
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        Issued { cert_pem: certificate.pem(), key_pem: key.serialize_pem(), der: certificate.der().to_vec() }
    }
}

/// The server's TLS files in a directory of the test's.
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl ServerFiles {
    pub fn write(dir: &Path, server: &Issued, client_ca: Option<&Ca>) -> Self {
        let files = Self { cert: dir.join("server.pem"), key: dir.join("server-key.pem"), client_ca: dir.join("client-ca.pem") };
        files.replace(server);
        if let Some(client_ca) = client_ca {
            std::fs::write(&files.client_ca, &client_ca.pem).unwrap();
        }
        files
    }

    /// As cert-manager does: new files renamed over the old ones, the key first.
    pub fn replace(&self, server: &Issued) {
        for (path, contents) in [(&self.key, &server.key_pem), (&self.cert, &server.cert_pem)] {
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, contents).unwrap();
            std::fs::rename(&temporary, path).unwrap();
        }
    }

    pub fn configure(&self, config: &mut chargeguard::config::Config, client_certificates: bool) {
        config.server.tls_cert_file = Some(self.cert.clone());
        config.server.tls_key_file = Some(self.key.clone());
        config.server.tls_client_ca_file = client_certificates.then(|| self.client_ca.clone());
        config.server.tls_reload_interval_ms = 100;
    }
}

/// A server on mutual TLS where the `orders` consumer presents `orders` (besides its token);
/// `dir` holds the server's files. The server stops before the files go (field order).
pub struct OrdersOverMutualTls {
    pub app: crate::support::TestApp,
    pub server_ca: Ca,
    pub orders: Issued,
    pub dir: tempfile::TempDir,
}

impl OrdersOverMutualTls {
    pub async fn spawn() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
        let orders = client_ca.client("orders");
        let files = ServerFiles::write(dir.path(), &server_ca.server(), Some(&client_ca));
        let app = crate::support::TestApp::spawn_with(|config| {
            files.configure(config, true);
            let consumer = config.consumers.iter_mut().find(|consumer| consumer.name == "orders").unwrap();
            consumer.client_cert_sha256 = chargeguard::grpc::certificate_sha256(&orders.der).into();
        })
        .await;
        Self { app, server_ca, orders, dir }
    }
}

/// A TLS channel trusting `ca`, presenting `identity` if given.
pub async fn tls_channel(addr: SocketAddr, ca: &Ca, identity: Option<&Issued>) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem)).domain_name(SERVER_NAME);
    if let Some(identity) = identity {
        tls = tls.identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    }
    Channel::from_shared(format!("https://{addr}")).unwrap().tls_config(tls)?.connect().await
}

pub async fn tls_client(addr: SocketAddr, ca: &Ca, identity: Option<&Issued>) -> Result<PaymentsClient<Channel>, tonic::transport::Error> {
    Ok(PaymentsClient::new(tls_channel(addr, ca, identity).await?))
}

/// The sum of the series of `name` whose labels include every one of `labels`
/// (`consumer="orders"`), read from `/metrics` at `http_addr`; 0 when there is none.
pub async fn metric(http_addr: SocketAddr, name: &str, labels: &[&str]) -> f64 {
    crate::support::metrics_text(http_addr)
        .await
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

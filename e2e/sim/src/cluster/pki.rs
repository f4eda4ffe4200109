//! Certificates and credentials: a CA, the API server's serving certificate (SANs 127.0.0.1,
//! localhost and the `kubernetes` service names), the service-account signing key, an admin
//! token and the admin kubeconfig.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::{Error, Result};

/// Files under `DIR/pki`.
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    pub tokens: PathBuf,
    /// The API server's client certificate towards the kubelets (logs, exec, port-forward),
    /// which trust the cluster's CA.
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
}

impl Pki {
    pub fn paths(dir: &Path) -> Pki {
        let pki = dir.join("pki");
        Pki {
            ca_cert: pki.join("ca.crt"),
            ca_key: pki.join("ca.key"),
            serving_cert: pki.join("apiserver.crt"),
            serving_key: pki.join("apiserver.key"),
            sa_key: pki.join("sa.key"),
            sa_pub: pki.join("sa.pub"),
            tokens: pki.join("tokens.csv"),
            kubelet_client_cert: pki.join("apiserver-kubelet-client.crt"),
            kubelet_client_key: pki.join("apiserver-kubelet-client.key"),
        }
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// A random UUID from the kernel (no extra dependency; the sim is Linux-only anyway).
pub fn random_uuid() -> Result<String> {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map_err(|e| Error::io("read /proc/sys/kernel/random/uuid", e))?;
    Ok(uuid.trim().to_string())
}

/// The CA's parameters; the same every time, so the CA can sign again later from its key alone
/// (the issuer of a certificate is its name and key).
fn ca_params() -> Result<CertificateParams> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "podha-sim-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca_params)
}

/// A client certificate signed by the cluster's CA for user `common_name` in group
/// `organization` (the API server maps CN to the user, O to groups), written as PEM to `cert`
/// and `key`. A real node's kubelet uses `system:node:<name>` in `system:nodes`, so the Node
/// authorizer and NodeRestriction treat it as that node.
pub fn issue_client_cert(
    dir: &Path,
    common_name: &str,
    organization: &str,
    cert: &Path,
    key: &Path,
) -> Result<()> {
    let paths = Pki::paths(dir);
    let ca_pem = std::fs::read_to_string(&paths.ca_key)
        .map_err(|e| Error::io(format!("read {}", paths.ca_key.display()), e))?;
    let ca_key = KeyPair::from_pem(&ca_pem)?;
    let issuer = Issuer::new(ca_params()?, &ca_key);
    let client_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, organization);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let signed = params.signed_by(&client_key, &issuer)?;
    write(cert, &signed.pem())?;
    write(key, &client_key.serialize_pem())
}

/// Writes every file of [`Pki`] and returns the admin token.
pub fn generate(dir: &Path) -> Result<String> {
    let paths = Pki::paths(dir);
    std::fs::create_dir_all(dir.join("pki")).map_err(|e| Error::io("create pki dir", e))?;

    let ca_key = KeyPair::generate()?;
    let ca_params = ca_params()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, &ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(
        [
            "127.0.0.1",
            "localhost",
            "10.96.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from)
        .to_vec(),
    )?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let sa_key = KeyPair::generate()?;
    let token = random_uuid()?.replace('-', "");

    write(&paths.ca_cert, &ca_cert.pem())?;
    write(&paths.ca_key, &ca_key.serialize_pem())?;
    write(&paths.serving_cert, &serving_cert.pem())?;
    write(&paths.serving_key, &serving_key.serialize_pem())?;
    write(&paths.sa_key, &sa_key.serialize_pem())?;
    write(&paths.sa_pub, &sa_key.public_key_pem())?;
    // token,user,uid,"groups"
    write(
        &paths.tokens,
        &format!("{token},admin,admin,\"system:masters\"\n"),
    )?;
    issue_client_cert(
        dir,
        "kube-apiserver-kubelet-client",
        "system:masters",
        &paths.kubelet_client_cert,
        &paths.kubelet_client_key,
    )?;
    Ok(token)
}

/// Writes the admin kubeconfig for `https://127.0.0.1:<port>`.
pub fn write_kubeconfig(path: &Path, ca_cert: &Path, port: u16, token: &str) -> Result<()> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "podha-sim",
            "cluster": {
                "server": format!("https://127.0.0.1:{port}"),
                "certificate-authority": ca_cert,
            },
        }],
        "users": [{ "name": "admin", "user": { "token": token } }],
        "contexts": [{
            "name": "podha-sim",
            "context": { "cluster": "podha-sim", "user": "admin" },
        }],
        "current-context": "podha-sim",
    });
    let yaml =
        serde_norway::to_string(&doc).map_err(|e| Error::Other(format!("kubeconfig: {e}")))?;
    write(path, &yaml)
}

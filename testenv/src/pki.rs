//! The certificates of one test cluster: a CA, the API server's serving certificate, the
//! admin's client certificate (`O=system:masters`) and the ServiceAccount signing key.

use std::path::Path;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::error::Error;
use crate::files::write_private_file;

/// Admin identity of the generated kubeconfig (bypasses RBAC through `system:masters`).
pub const ADMIN_USER: &str = "kubetun-admin";

/// Names the serving certificate answers for: loopback and the in-cluster Service names.
const SERVER_NAMES: [&str; 7] = [
    "127.0.0.1",
    "localhost",
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

#[derive(Debug)]
pub(crate) struct Pki {
    files: Vec<(&'static str, String)>,
}

impl Pki {
    pub(crate) fn generate() -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kubetun-test-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;

        let server_key = KeyPair::generate()?;
        let mut server_params = CertificateParams::new(SERVER_NAMES.map(str::to_owned).to_vec())?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = server_params.signed_by(&server_key, &ca, &ca_key)?;

        let admin_key = KeyPair::generate()?;
        let admin = client_cert(ADMIN_USER, "system:masters", &admin_key, &ca, &ca_key)?;

        let sa_key = KeyPair::generate()?;
        Ok(Self {
            files: vec![
                ("ca.crt", ca.pem()),
                ("server.crt", server.pem()),
                ("server.key", server_key.serialize_pem()),
                ("admin.crt", admin.pem()),
                ("admin.key", admin_key.serialize_pem()),
                ("sa.key", sa_key.serialize_pem()),
                ("sa.pub", sa_key.public_key_pem()),
            ],
        })
    }

    pub(crate) fn write(&self, dir: &Path) -> Result<(), Error> {
        for (name, pem) in &self.files {
            write_private_file(&dir.join(name), pem.as_bytes())?;
        }
        Ok(())
    }
}

fn client_cert(
    user: &str,
    group: &str,
    key: &KeyPair,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> Result<Certificate, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    params
        .distinguished_name
        .push(DnType::OrganizationName, group);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params.signed_by(key, ca, ca_key)?)
}

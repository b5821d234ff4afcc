//! The credentials of services across clusters: with a link, each cluster may read the other's
//! exported services and nothing else. In the exporting cluster the connector makes a
//! ServiceAccount `kubetun-peer-<importer>` whose Role allows `get`, `list` and `watch` of
//! ExportedServices in kubetun's namespace only (and of the one ClientIdentity answering the
//! importer's policies, `for-<importer>`), asks for a token, and writes a kubeconfig with
//! it into the importing cluster (Secret `kubetun-services-<exporter>`, labelled
//! [`CREDENTIAL_LABEL`]). The importer's controller reads its imports with it; it writes only
//! into its own cluster. Deleting the ServiceAccount (disconnect, reset) revokes the token.
//!
//! A pass writes only when the credential is missing, names another API server, or expires
//! within [`RENEW_BEFORE`]; tokens live [`TOKEN_LIFETIME`] (or what the API server grants).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt as _};
use kubetun_crds::contract::link::{MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, PEER_LABEL};
use kubetun_crds::contract::services::{
    CREDENTIAL_KEY, CREDENTIAL_LABEL, EXPIRES_ANNOTATION, SERVER_ANNOTATION, identity_name,
};
use serde_json::json;

use super::delete::{Removed, delete_ignoring_missing};
use super::{ClusterHandle, ConnectError, FIELD_MANAGER, Progress};
use crate::plumbing::kubeconfig::ServerAccess;

/// How long a token is asked for.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// A credential expiring sooner than this is renewed by the next pass.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The ServiceAccount (and Role, RoleBinding) in an exporter for `importer_id`.
pub fn reader_name(importer_id: &str) -> String {
    format!("kubetun-peer-{importer_id}")
}

/// The credential Secret in an importer for `exporter_id`.
pub fn credential_name(exporter_id: &str) -> String {
    format!("kubetun-services-{exporter_id}")
}

/// Gives `importer` read access to `exporter`'s exported services, unless it has a current
/// credential. Returns the number of writes. Without [`ClusterHandle::server`] (the
/// exporter's API server address is unknown) nothing is done.
pub(super) async fn grant(
    exporter: &ClusterHandle,
    exporter_id: &str,
    importer: &ClusterHandle,
    importer_id: &str,
    progress: &dyn Progress,
) -> Result<usize, ConnectError> {
    let Some(server) = &exporter.server else {
        return Ok(0);
    };
    let secrets: Api<Secret> = Api::namespaced(importer.client.clone(), &importer.namespace);
    let name = credential_name(exporter_id);
    let current = secrets
        .get_opt(&name)
        .await
        .map_err(importer.api_error::<Secret>(importer_id, "get", &name))?;
    let fresh = current.as_ref().is_some_and(|secret| {
        let annotations = secret.annotations();
        let expires = annotations
            .get(EXPIRES_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok());
        annotations.get(SERVER_ANNOTATION) == Some(&server.url)
            && expires.is_some_and(|t| {
                t.as_second() > Timestamp::now().as_second() + RENEW_BEFORE.as_secs() as i64
            })
    });
    let reader = reader_name(importer_id);
    if fresh {
        // A credential from before a rule was added gets the rule; the token stays.
        let roles: Api<Role> = Api::namespaced(exporter.client.clone(), &exporter.namespace);
        let role = roles
            .get_opt(&reader)
            .await
            .map_err(exporter.api_error::<Role>(exporter_id, "get", &reader))?;
        if role.and_then(|r| r.rules) == Some(reader_rules(importer_id)) {
            return Ok(0);
        }
        apply(
            exporter,
            exporter_id,
            &reader_role(exporter, &reader, importer_id),
        )
        .await?;
        return Ok(1);
    }
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
        (PEER_LABEL.to_owned(), importer_id.to_owned()),
    ]);
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(exporter.namespace.clone()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    apply(
        exporter,
        exporter_id,
        &ServiceAccount {
            metadata: meta(&reader),
            ..Default::default()
        },
    )
    .await?;
    apply(
        exporter,
        exporter_id,
        &reader_role(exporter, &reader, importer_id),
    )
    .await?;
    apply(
        exporter,
        exporter_id,
        &RoleBinding {
            metadata: meta(&reader),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "Role".to_owned(),
                name: reader.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: reader.clone(),
                namespace: Some(exporter.namespace.clone()),
                ..Subject::default()
            }]),
        },
    )
    .await?;
    let accounts: Api<ServiceAccount> =
        Api::namespaced(exporter.client.clone(), &exporter.namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request(&reader, &Default::default(), &request)
        .await
        .map_err(exporter.api_error::<ServiceAccount>(exporter_id, "request a token for", &reader))?
        .status
        .unwrap_or_default();
    let (Some(token), Some(expires)) = (issued.token, issued.expiration_timestamp) else {
        return Err(ConnectError::NoToken {
            cluster: exporter.label.clone(),
            service_account: format!("{}/{reader}", exporter.namespace),
        });
    };
    let kubeconfig = kubeconfig(server, exporter_id, &exporter.namespace, &token);
    let mut annotations = BTreeMap::from([(SERVER_ANNOTATION.to_owned(), server.url.clone())]);
    annotations.insert(EXPIRES_ANNOTATION.to_owned(), expires.0.to_string());
    let mut labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
        (PEER_LABEL.to_owned(), exporter_id.to_owned()),
    ]);
    labels.insert(CREDENTIAL_LABEL.to_owned(), exporter_id.to_owned());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(importer.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            CREDENTIAL_KEY.to_owned(),
            ByteString(kubeconfig.into_bytes()),
        )])),
        ..Secret::default()
    };
    apply(importer, importer_id, &secret).await?;
    progress.done(
        &importer.label,
        &format!(
            "Secret {}/{name}: read access to {exporter_id}'s exported services",
            importer.namespace
        ),
    );
    Ok(4)
}

/// What `importer` may do in the exporter: read its ExportedServices, and the one
/// ClientIdentity that answers `importer`'s own policies (its pods' addresses for
/// `importer` only: no cluster reads the answer given to another).
pub fn reader_rules(importer_id: &str) -> Vec<PolicyRule> {
    let read = || ["get", "list", "watch"].map(str::to_owned).to_vec();
    vec![
        PolicyRule {
            api_groups: Some(vec![kubetun_crds::GROUP.to_owned()]),
            resources: Some(vec!["exportedservices".to_owned()]),
            verbs: read(),
            ..PolicyRule::default()
        },
        PolicyRule {
            api_groups: Some(vec![kubetun_crds::GROUP.to_owned()]),
            resources: Some(vec!["clientidentities".to_owned()]),
            resource_names: Some(vec![identity_name(importer_id)]),
            verbs: read(),
            ..PolicyRule::default()
        },
    ]
}

/// The reader's Role in the exporter.
fn reader_role(exporter: &ClusterHandle, reader: &str, importer_id: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(reader.to_owned()),
            namespace: Some(exporter.namespace.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
                (PEER_LABEL.to_owned(), importer_id.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        rules: Some(reader_rules(importer_id)),
    }
}

/// Removes, on one cluster, the credential for `peer_id`'s services and `peer_id`'s reader
/// of this cluster's (which revokes its token).
pub(super) async fn revoke(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    removed: &mut Removed,
    progress: &dyn Progress,
) -> Result<(), ConnectError> {
    let credential = credential_name(peer_id);
    let reader = reader_name(peer_id);
    remove::<Secret>(handle, cluster_id, &credential, peer_id, removed, progress).await?;
    remove::<RoleBinding>(handle, cluster_id, &reader, peer_id, removed, progress).await?;
    remove::<Role>(handle, cluster_id, &reader, peer_id, removed, progress).await?;
    remove::<ServiceAccount>(handle, cluster_id, &reader, peer_id, removed, progress).await
}

/// Deletes `name` if the connector made it for `peer_id`.
async fn remove<K>(
    handle: &ClusterHandle,
    cluster_id: &str,
    name: &str,
    peer_id: &str,
    removed: &mut Removed,
    progress: &dyn Progress,
) -> Result<(), ConnectError>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let Some(object) = api
        .get_opt(name)
        .await
        .map_err(handle.api_error::<K>(cluster_id, "get", name))?
    else {
        return Ok(());
    };
    let labels = object.meta().labels.clone().unwrap_or_default();
    let ours = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_CONNECTOR)
        && labels.get(PEER_LABEL).map(String::as_str) == Some(peer_id);
    if !ours {
        return Ok(());
    }
    delete_ignoring_missing(&api, name)
        .await
        .map_err(handle.api_error::<K>(cluster_id, "delete", name))?;
    let described = handle.object::<K>(name);
    progress.done(&handle.label, &format!("deleted {described}"));
    removed.objects.push(described);
    Ok(())
}

async fn apply<K>(handle: &ClusterHandle, cluster_id: &str, object: &K) -> Result<(), ConnectError>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(handle.api_error::<K>(cluster_id, "apply", &name))?;
    Ok(())
}

/// A kubeconfig for `server` with `token`, in the exporter's kubetun `namespace`.
fn kubeconfig(server: &ServerAccess, exporter_id: &str, namespace: &str, token: &str) -> String {
    let mut cluster = json!({ "server": server.url });
    if server.insecure {
        cluster["insecure-skip-tls-verify"] = true.into();
    }
    if let Some(name) = &server.tls_server_name {
        cluster["tls-server-name"] = name.clone().into();
    }
    if !server.ca_der.is_empty() {
        let pem: String = server.ca_der.iter().map(|der| pem(der)).collect();
        cluster["certificate-authority-data"] =
            base64::engine::general_purpose::STANDARD.encode(pem).into();
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": exporter_id, "cluster": cluster }],
        "users": [{ "name": "kubetun-services", "user": { "token": token } }],
        "contexts": [{ "name": exporter_id, "context": {
            "cluster": exporter_id, "user": "kubetun-services", "namespace": namespace,
        } }],
        "current-context": exporter_id,
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// A DER certificate as PEM.
fn pem(der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

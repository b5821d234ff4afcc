//! Services across clusters on two real API servers: Milan exports a Service, Rome imports it
//! in its own views of Milan's addresses (10.70.0.0/16 seen as 10.71.0.0/16 from Rome), with
//! Milan's least-privilege credential; endpoint churn, an address outside Milan's CIDRs, a
//! conflict, an invalid export, unexport and the link's removal.

use crate::realapi_support;
use crate::services_support;

// Through a hub, under faults, with real workloads.
mod faults;
mod hub;
mod workloads;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams};
use kubetun_controller::operator::services::dns_server::{self, SharedTable};
use kubetun_controller::operator::services::metrics::ServiceMetrics;
use kubetun_crds::contract::services::{CREDENTIAL_KEY, CREDENTIAL_LABEL};
use kubetun_crds::mcs::v1beta1::{ServiceExport, ServiceImport};
use kubetun_crds::{ExportedService, TunnelEndpoint};
use realapi_support::{Leaf, NAMESPACE};
use serde_json::json;
use services_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_exported_in_milan_is_imported_in_romes_views() {
    let Some([rome_cluster, milan_cluster]) = realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    create_shop(&[&rome, &milan]).await;

    let reader_path = link_by_hand(&rome, &milan_cluster).await;
    let reader = kubetun_testenv::client_for(&reader_path).await.unwrap();
    let forbidden =
        |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    assert!(forbidden(
        Api::<Service>::namespaced(reader.clone(), SHOP)
            .list(&ListParams::default())
            .await
            .map(|_| ())
    ));
    assert!(forbidden(
        Api::<Secret>::namespaced(reader.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .map(|_| ())
    ));
    assert!(
        Api::<ExportedService>::namespaced(reader.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .is_ok()
    );

    let rome_dns = SharedTable::default();
    let sockets = dns_server::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (udp_addr, tcp_addr) = (
        sockets.0.local_addr().unwrap(),
        sockets.1.local_addr().unwrap(),
    );
    let dns_task = tokio::spawn(dns_server::serve(
        sockets,
        rome_dns.clone(),
        Default::default(),
    ));
    assert_eq!(
        resolve_udp(udp_addr, "web.shop.svc.clusterset.local.")
            .await
            .0,
        ResponseCode::NXDomain
    );
    let rome_metrics = ServiceMetrics::default();
    let rome_task = run_services_with_dns(
        &rome_cluster,
        "rome",
        "10.60.0.0/16",
        rome_dns,
        rome_metrics.clone(),
    )
    .await;
    let milan_task = run_services(&milan_cluster, "milan", "10.70.0.0/16").await;

    // Milan exports web: two pods and an address outside its CIDRs.
    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice(
            "web-1",
            &[
                ("10.70.1.5", true),
                ("10.70.1.6", false),
                ("192.0.2.9", true),
            ],
        ),
    )
    .await;
    let milan_k = milan_cluster.kubeconfig_path();
    let milan_k = milan_k.to_str().unwrap();
    let exported_at = Instant::now();
    cli_ok(&[
        "service",
        "export",
        "web",
        "-n",
        SHOP,
        "--kubeconfig",
        milan_k,
    ])
    .await;

    let imports: Api<ServiceImport> = Api::namespaced(rome.clone(), SHOP);
    let (import, _) = until("Rome's ServiceImport", || async {
        imports
            .get_opt("web")
            .await
            .unwrap()
            .filter(|i| !i.spec.ips.is_empty() && i.status.is_some())
    })
    .await;
    let (endpoints, _) = until("Rome's endpoints", || async {
        let e = imported_endpoints(&rome).await;
        (e.len() == 2).then_some(e)
    })
    .await;
    println!(
        "export -> imported with endpoints in Rome: {:?}",
        exported_at.elapsed()
    );
    assert_eq!(
        endpoints,
        BTreeMap::from([
            ("10.71.1.5".to_owned(), true),
            ("10.71.1.6".to_owned(), false)
        ])
    );
    assert_eq!(import.spec.ports.len(), 1);
    assert_eq!(import.spec.ports[0].port, 80);
    let clusters: Vec<_> = import
        .status
        .unwrap()
        .clusters
        .into_iter()
        .map(|c| c.cluster)
        .collect();
    assert_eq!(clusters, ["milan"]);
    let derived = Api::<Service>::namespaced(rome.clone(), SHOP)
        .get("mcs-web")
        .await
        .unwrap();
    let spec = derived.spec.unwrap();
    assert_eq!(spec.selector, None, "the derived Service has no selector");
    assert_eq!(
        Some(import.spec.ips[0].clone()),
        spec.cluster_ip,
        "the ClusterSetIP is its ClusterIP"
    );

    // The metrics say the same.
    assert_eq!(rome_metrics.imports.get(), 1);
    assert_eq!(rome_metrics.imported_endpoints.get(), 2);
    assert_eq!(rome_metrics.peers.get(), 1);
    assert_eq!(
        rome_metrics.dropped_endpoints.get(),
        1,
        "192.0.2.9 is outside Milan's CIDRs"
    );

    // By name, over UDP and TCP: the ClusterSetIP.
    let (code, answers) = resolve_udp(udp_addr, "web.shop.svc.clusterset.local.").await;
    assert_eq!(
        (code, answers),
        (ResponseCode::NoError, vec![import.spec.ips[0].clone()])
    );
    assert_eq!(
        resolve_tcp(tcp_addr, "web.shop.svc.clusterset.local.").await,
        vec![import.spec.ips[0].clone()]
    );
    // Garbage does not stop the server.
    let probe = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    probe
        .send_to(&[0xde, 0xad, 0x01, 0x00, 0xff], udp_addr)
        .await
        .unwrap();
    probe.send_to(&vec![0xab; 9000], udp_addr).await.unwrap();
    let mut oversized = tokio::net::TcpStream::connect(tcp_addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut oversized, &[0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    assert_eq!(
        resolve_udp(udp_addr, "web.shop.svc.clusterset.local.")
            .await
            .0,
        ResponseCode::NoError
    );

    let exports: Api<ServiceExport> = Api::namespaced(milan.clone(), SHOP);
    let (valid, _) = until("Milan's conditions", || async {
        let e = exports.get("web").await.unwrap();
        Some((
            condition(&e, "Valid")?,
            condition(&e, "Ready")?,
            condition(&e, "Conflict")?,
        ))
    })
    .await;
    assert_eq!(
        (valid.0.0.as_str(), valid.1.0.as_str(), valid.2.0.as_str()),
        ("True", "True", "False")
    );
    // Milan imports its own export, at its own addresses.
    until("Milan's own import", || async {
        Api::<ServiceImport>::namespaced(milan.clone(), SHOP)
            .get_opt("web")
            .await
            .unwrap()
    })
    .await;

    // Pod churn reaches Rome.
    apply(
        &milan,
        Some(SHOP),
        web_slice(
            "web-1",
            &[
                ("10.70.1.5", true),
                ("10.70.1.6", true),
                ("10.70.2.7", true),
            ],
        ),
    )
    .await;
    let (_, churn) = until("churn in Rome", || async {
        let e = imported_endpoints(&rome).await;
        (e.get("10.71.2.7") == Some(&true) && e.get("10.71.1.6") == Some(&true)).then_some(())
    })
    .await;
    println!("endpoint change -> Rome's slice: {churn:?}");
    assert!(churn < Duration::from_secs(2), "{churn:?}");

    // Rome exports web too, younger and with another port: Rome's export reports the
    // conflict, naming both sides. (Milan reports it too when it reads Rome's offers, which
    // this one-way link does not give it; the conformance suite checks both, linked both ways.)
    apply(&rome, Some(SHOP), web_service(8443)).await;
    apply(&rome, Some(SHOP), export("web")).await;
    let rome_exports: Api<ServiceExport> = Api::namespaced(rome.clone(), SHOP);
    let (conflict, _) = until("Rome's conflict", || async {
        let c = condition(&rome_exports.get("web").await.unwrap(), "Conflict")?;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert_eq!(conflict.1, "PortConflict");
    assert!(
        conflict.2.contains("80/TCP in milan (older)") && conflict.2.contains("8443/TCP in rome"),
        "{}",
        conflict.2
    );
    Api::<ServiceExport>::namespaced(rome.clone(), SHOP)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();

    // ExternalName cannot be exported.
    apply(&milan, Some(SHOP), json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": SHOP},
        "spec": {"type": "ExternalName", "externalName": "example.invalid"}})).await;
    apply(&milan, Some(SHOP), export("ext")).await;
    let (invalid, _) = until("ExternalName refused", || async {
        condition(&exports.get("ext").await.unwrap(), "Valid").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(invalid.1, "InvalidServiceType");
    assert!(imports.get_opt("ext").await.unwrap().is_none());

    // What each cluster exports and imports, as a script reads it (once Rome's own export,
    // deleted above, has left the import).
    until("Milan the only exporter", || async {
        let import = imports.get("web").await.ok()?;
        let clusters: Vec<String> = import
            .status?
            .clusters
            .into_iter()
            .map(|c| c.cluster)
            .collect();
        (clusters == ["milan"]).then_some(())
    })
    .await;
    let rome_k = rome_cluster.kubeconfig_path();
    let listed: serde_json::Value = serde_json::from_str(
        &cli_ok(&[
            "service",
            "list",
            "-o",
            "json",
            "--kubeconfig",
            rome_k.to_str().unwrap(),
        ])
        .await,
    )
    .unwrap();
    let web = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "web")
        .unwrap();
    assert_eq!(web["importType"], "ClusterSetIP");
    assert_eq!(web["clusters"], json!(["milan"]));
    assert_eq!(web["readyEndpoints"], 3);
    let milan_list = cli_ok(&["service", "list", "-n", SHOP, "--kubeconfig", milan_k]).await;
    assert!(
        milan_list.contains("Invalid: Service shop/ext is of type ExternalName"),
        "{milan_list}"
    );
    // Bad input: a clear error and a non-zero exit.
    let missing = realapi_support::kubetun(&[
        "service",
        "export",
        "nope",
        "-n",
        SHOP,
        "--kubeconfig",
        milan_k,
    ])
    .await;
    assert!(!missing.status.success());
    assert!(realapi_support::text(&missing.stderr).contains("Service shop/nope does not exist"));

    // Unexport: the import and its endpoints go from Rome.
    cli_ok(&[
        "service",
        "unexport",
        "web",
        "-n",
        SHOP,
        "--kubeconfig",
        milan_k,
    ])
    .await;
    // The name goes with the pass that deletes the import (its table is swapped in at the
    // pass's end), so it may still answer for a moment after the objects went.
    until("unexported", || async {
        let name = resolve_udp(udp_addr, "web.shop.svc.clusterset.local.")
            .await
            .0;
        (imports.get_opt("web").await.unwrap().is_none()
            && imported_endpoints(&rome).await.is_empty()
            && name == ResponseCode::NXDomain)
            .then_some(())
    })
    .await;
    drop(oversized);

    // Export again, then remove the link: the import goes.
    apply(&milan, Some(SHOP), export("web")).await;
    until("imported again", || async {
        imports.get_opt("web").await.unwrap()
    })
    .await;
    Api::<TunnelEndpoint>::namespaced(rome.clone(), NAMESPACE)
        .delete("milan", &DeleteParams::default())
        .await
        .unwrap();
    until("link removed", || async {
        (imports.get_opt("web").await.unwrap().is_none()
            && imported_endpoints(&rome).await.is_empty())
        .then_some(())
    })
    .await;
    let offered = Api::<ExportedService>::namespaced(milan.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        offered
            .items
            .iter()
            .map(|o| o.name_any())
            .collect::<Vec<_>>(),
        ["shop.web"]
    );
    rome_task.abort();
    milan_task.abort();
    dns_task.abort();
}

fn query(name: &str) -> Message {
    let mut message = Message::query();
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    message
}

/// Asks the DNS server at `addr` for A records of `name` over UDP.
async fn resolve_udp(addr: std::net::SocketAddr, name: &str) -> (ResponseCode, Vec<String>) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let message = query(name);
    socket
        .send_to(&message.to_vec().unwrap(), addr)
        .await
        .unwrap();
    let mut buffer = vec![0; 4096];
    loop {
        let len = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buffer))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        let reply = Message::from_vec(&buffer[..len]).unwrap();
        if reply.metadata.id == message.metadata.id {
            let answers = reply.answers.iter().map(|r| r.data.to_string()).collect();
            return (reply.metadata.response_code, answers);
        }
    }
}

/// The same over TCP (length-prefixed).
async fn resolve_tcp(addr: std::net::SocketAddr, name: &str) -> Vec<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let bytes = query(name).to_vec().unwrap();
    stream.write_u16(bytes.len() as u16).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    let len = stream.read_u16().await.unwrap();
    let mut reply = vec![0; usize::from(len)];
    stream.read_exact(&mut reply).await.unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    reply.answers.iter().map(|r| r.data.to_string()).collect()
}

/// The token inside a credential Secret's kubeconfig.
fn token_of(secret: &Secret) -> String {
    let bytes = &secret.data.as_ref().unwrap()[CREDENTIAL_KEY].0;
    let config: serde_json::Value = serde_yaml::from_slice(bytes).unwrap();
    config["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_connect_grants_read_access_and_disconnect_revokes_it() {
    let Some([rome_cluster, milan_cluster]) = realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    // Both clusters' pods are 10.70.0.0/16: each sees the other's at a remapped view.
    let _rome_leaf = Leaf::start(&rome_cluster, "rome", "10.70.0.0/16", "10.90.0.0/16").await;
    let _milan_leaf = Leaf::start(&milan_cluster, "milan", "10.70.0.0/16", "10.91.0.0/16").await;
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    let tasks = [
        run_services(&rome_cluster, "rome", "10.70.0.0/16").await,
        run_services(&milan_cluster, "milan", "10.70.0.0/16").await,
    ];
    create_shop(&[&milan]).await;
    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.1.5", true)]),
    )
    .await;
    apply(&milan, Some(SHOP), export("web")).await;

    let (rome_k, milan_k) = (
        rome_cluster.kubeconfig_path(),
        milan_cluster.kubeconfig_path(),
    );
    let (rome_k, milan_k) = (rome_k.to_str().unwrap(), milan_k.to_str().unwrap());
    let connect = realapi_support::kubetun(&[
        "network",
        "connect",
        "--kubeconfig",
        rome_k,
        "--remote-kubeconfig",
        milan_k,
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    let out = realapi_support::text(&connect.stdout) + &realapi_support::text(&connect.stderr);
    assert!(connect.status.success(), "{out}");

    // Each side holds a credential for the other's exports, printed nowhere.
    let credential = Api::<Secret>::namespaced(rome.clone(), NAMESPACE)
        .get("kubetun-services-milan")
        .await
        .unwrap();
    assert_eq!(
        credential
            .labels()
            .get(CREDENTIAL_LABEL)
            .map(String::as_str),
        Some("milan")
    );
    let token = token_of(&credential);
    assert!(!out.contains(&token), "the token is printed: {out}");
    Api::<Secret>::namespaced(milan.clone(), NAMESPACE)
        .get("kubetun-services-rome")
        .await
        .unwrap();

    // Rome imports web at its view of Milan's pod CIDR.
    let te = Api::<TunnelEndpoint>::namespaced(rome.clone(), NAMESPACE)
        .get("milan")
        .await
        .unwrap();
    let view: ipnet::IpNet = te.spec.remote_pod_cidrs[0].view.parse().unwrap();
    assert_ne!(
        view.to_string(),
        "10.70.0.0/16",
        "Milan's pods are remapped in Rome"
    );
    let expected = match view.network() {
        std::net::IpAddr::V4(v) => std::net::Ipv4Addr::from(u32::from(v) | 0x0105).to_string(),
        std::net::IpAddr::V6(_) => unreachable!(),
    };
    let imports: Api<ServiceImport> = Api::namespaced(rome.clone(), SHOP);
    // Namespace sameness: nothing is imported until Rome has the namespace.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(imports.get_opt("web").await.is_err() || imported_endpoints(&rome).await.is_empty());
    // kubetun service diagnose names that hop.
    assert_eq!(
        diagnosed_broken_hop(milan_k, rome_k).await.as_deref(),
        Some("namespace")
    );
    create_shop(&[&rome]).await;
    until("Rome's import through the connect credential", || async {
        let e = imported_endpoints(&rome).await;
        (e.get(&expected) == Some(&true) && imports.get_opt("web").await.ok()??.spec.ips.len() == 1)
            .then_some(())
    })
    .await;

    assert_eq!(
        diagnosed_broken_hop(milan_k, rome_k).await,
        None,
        "every hop works"
    );
    // A second connect changes nothing: the credential is current.
    let again = realapi_support::kubetun(&[
        "network",
        "connect",
        "--kubeconfig",
        rome_k,
        "--remote-kubeconfig",
        milan_k,
    ])
    .await;
    assert!(again.status.success());
    let unchanged = Api::<Secret>::namespaced(rome.clone(), NAMESPACE)
        .get("kubetun-services-milan")
        .await
        .unwrap();
    assert_eq!(unchanged.resource_version(), credential.resource_version());

    let disconnect = realapi_support::kubetun(&[
        "network",
        "disconnect",
        "--kubeconfig",
        rome_k,
        "--remote-kubeconfig",
        milan_k,
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    assert!(
        disconnect.status.success(),
        "{}",
        realapi_support::text(&disconnect.stderr)
    );
    for (client, peer) in [(&rome, "milan"), (&milan, "rome")] {
        let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
        assert!(
            secrets
                .get_opt(&format!("kubetun-services-{peer}"))
                .await
                .unwrap()
                .is_none()
        );
        let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
            client.clone(),
            NAMESPACE,
        );
        assert!(
            accounts
                .get_opt(&format!("kubetun-peer-{peer}"))
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(
        diagnosed_broken_hop(milan_k, rome_k).await.as_deref(),
        Some("link")
    );
    // The token died with its ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.kubeconfig");
    std::fs::write(&path, &credential.data.as_ref().unwrap()[CREDENTIAL_KEY].0).unwrap();
    let old = kubetun_testenv::client_for(&path).await.unwrap();
    let refused = Api::<ExportedService>::namespaced(old, NAMESPACE)
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403),
        "{refused:?}"
    );
    until("import gone after disconnect", || async {
        (imports.get_opt("web").await.unwrap().is_none()
            && imported_endpoints(&rome).await.is_empty())
        .then_some(())
    })
    .await;
    for task in tasks {
        task.abort();
    }
}

/// `kubetun service diagnose web -n shop` from Milan to Rome: the first broken hop, if any
/// (the exit status says the same).
async fn diagnosed_broken_hop(milan_k: &str, rome_k: &str) -> Option<String> {
    let out = realapi_support::kubetun(&[
        "service",
        "diagnose",
        "web",
        "-n",
        SHOP,
        "--kubeconfig",
        milan_k,
        "--importer-kubeconfig",
        rome_k,
        "-o",
        "json",
    ])
    .await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", realapi_support::text(&out.stderr)));
    let broken = report["firstBroken"].as_u64().map(|i| {
        report["checks"][i as usize]["hop"]
            .as_str()
            .unwrap()
            .to_owned()
    });
    assert_eq!(out.status.success(), broken.is_none(), "{report}");
    broken
}

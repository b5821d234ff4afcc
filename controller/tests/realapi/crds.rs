//! The CRDs on a real API server: no kubetun plural, singular or short name collides with
//! a built-in resource (discovery of every group), and the network ID kind is `NetworkID`.

use crate::realapi_support;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;

/// Every served resource list: the core group and each group's preferred version.
async fn discovery(client: &kube::Client) -> Vec<APIResourceList> {
    let mut lists = vec![client.list_core_api_resources("v1").await.unwrap()];
    for group in client.list_api_groups().await.unwrap().groups {
        for version in &group.versions {
            lists.push(
                client
                    .list_api_group_resources(&version.group_version)
                    .await
                    .unwrap(),
            );
        }
    }
    lists
}

#[tokio::test]
async fn kubetun_names_collide_with_no_built_in_resource() {
    let Some([cluster]) = realapi_support::clusters(["names"]).await else {
        return;
    };
    let client = cluster.client().await.unwrap();
    // name -> (group/version, resource) of everything kubectl can resolve a name to.
    let mut built_in: BTreeMap<String, String> = BTreeMap::new();
    let mut ours: Vec<(String, String)> = Vec::new();
    for list in discovery(&client).await {
        for resource in list.resources.iter().filter(|r| !r.name.contains('/')) {
            let mut names = vec![resource.name.clone(), resource.singular_name.clone()];
            names.extend(resource.short_names.clone().unwrap_or_default());
            let owner = format!("{} {}", list.group_version, resource.name);
            for name in names.into_iter().filter(|n| !n.is_empty()) {
                if list.group_version.starts_with("net.kubetun.io/") {
                    ours.push((name, resource.kind.clone()));
                } else {
                    built_in.insert(name, owner.clone());
                }
            }
        }
    }
    assert!(
        built_in.contains_key("sc") && built_in.contains_key("svc"),
        "discovery lists the built-in short names: {built_in:?}"
    );
    assert!(ours.len() >= 15, "three names per kubetun kind: {ours:?}");
    let collisions: Vec<String> = ours
        .iter()
        .filter_map(|(name, kind)| {
            built_in
                .get(name)
                .map(|owner| format!("{kind}: {name} is also {owner}"))
        })
        .collect();
    assert!(collisions.is_empty(), "{collisions:#?}");

    // `kubectl get ksc` is ours; `sc` stays StorageClass.
    let shortcuts = cluster.kubectl(&["get", "ksc", "-A"]).unwrap_or_default();
    assert!(!shortcuts.contains("StorageClass"));
    let explained = cluster.kubectl(&["explain", "sc"]).unwrap();
    assert!(explained.contains("StorageClass"), "{explained}");

    // The ID kind is spelled like UID and ClusterID.
    let kinds: Vec<&str> = ours.iter().map(|(_, kind)| kind.as_str()).collect();
    assert!(kinds.contains(&"NetworkID"), "{kinds:?}");
    assert!(!kinds.contains(&"NetworkId"), "{kinds:?}");
    let example = realapi_support::repo_root().join("deploy/examples/networkid.yaml");
    let created = cluster
        .kubectl(&[
            "create",
            "-f",
            example.to_str().unwrap(),
            "-o",
            "jsonpath={.kind}",
        ])
        .unwrap();
    assert_eq!(created, "NetworkID");
    let listed = cluster
        .kubectl(&[
            "get",
            "networkids",
            "-o",
            "jsonpath={.kind} {.items[0].kind}",
        ])
        .unwrap();
    assert_eq!(listed, "List NetworkID");
    let typed: kube::Api<kubetun_crds::NetworkId> = kube::Api::all(client);
    assert_eq!(
        typed.get("4243").await.unwrap().spec.claim_ref.name,
        "payments"
    );
}

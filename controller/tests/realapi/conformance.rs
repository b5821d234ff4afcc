//! The Multi-Cluster Services API's own conformance suite (kubernetes-sigs/mcs-api
//! `conformance/`, the build in `shared/tools`) against two clusters that run what a user's
//! would: real API servers with kube-controller-manager and fake-kubelet (Deployments, pods,
//! EndpointSlices, namespace deletion), kubetun's CRDs and RBAC, the clusters linked with
//! `kubetun network connect`, and each cluster's services loop running as the controller's
//! ServiceAccount. Every spec that needs no pod that really runs (labels `Connectivity` and
//! `DNS` excluded) must pass, in both address layouts users have: distinct pod CIDRs, and the
//! same pod CIDR in both clusters (kind's 10.244.0.0/16), where every endpoint is remapped.
//!
//! The suite's `report.yaml` of each layout is rendered into one Markdown report
//! (`target/mcs-conformance/conformance.md`; with `KUBETUN_WRITE_CONFORMANCE=1` also
//! `docs/conformance.md`).

use std::path::Path;
use std::time::Duration;

use kubetun_testenv::mcs::{self, Report};

use crate::realapi_support::{self, Leaf, repo_root};
use crate::services_support::{install_services_on, run_services};

/// What runs without pods that really run (the suite's README: 17 of its 27 specs).
const EXPECTED_RUN: usize = 17;

/// One address layout: the two clusters' pod CIDRs.
struct Layout {
    title: &'static str,
    rome: &'static str,
    milan: &'static str,
}

const LAYOUTS: [Layout; 2] = [
    Layout {
        title: "distinct pod CIDRs (rome 10.60.0.0/16, milan 10.70.0.0/16)",
        rome: "10.60.0.0/16",
        milan: "10.70.0.0/16",
    },
    Layout {
        title: "identical pod CIDRs (10.244.0.0/16 in both, every endpoint remapped)",
        rome: "10.244.0.0/16",
        milan: "10.244.0.0/16",
    },
];

/// Starts both clusters of `layout`, links them, runs the suite; its report and run time.
async fn run_layout(suite: &Path, layout: &Layout, work: &Path) -> Option<(Report, Duration)> {
    let [rome_cluster, milan_cluster] = realapi_support::clusters(["rome", "milan"]).await?;
    let workloads = [
        rome_cluster.start_workloads(layout.rome, "rome-node-1"),
        milan_cluster.start_workloads(layout.milan, "milan-node-1"),
    ];
    let _workloads: Vec<_> = match workloads.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(w) => w,
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping the MCS conformance suite: {e}");
            return None;
        }
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let _rome_leaf = Leaf::start(&rome_cluster, "rome", layout.rome, "10.90.0.0/16").await;
    let _milan_leaf = Leaf::start(&milan_cluster, "milan", layout.milan, "10.91.0.0/16").await;
    let tasks = [
        run_services(&rome_cluster, "rome", layout.rome).await,
        run_services(&milan_cluster, "milan", layout.milan).await,
    ];
    let (rome_k, milan_k) = (
        rome_cluster.kubeconfig_path(),
        milan_cluster.kubeconfig_path(),
    );
    let connect = realapi_support::kubetun(&[
        "network",
        "connect",
        "--kubeconfig",
        rome_k.to_str().unwrap(),
        "--remote-kubeconfig",
        milan_k.to_str().unwrap(),
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    assert!(
        connect.status.success(),
        "{}{}",
        realapi_support::text(&connect.stdout),
        realapi_support::text(&connect.stderr)
    );
    // The layout is what it says: with one pod CIDR in both, Rome sees Milan's pods remapped.
    let te = kube::Api::<kubetun_crds::TunnelEndpoint>::namespaced(
        rome_cluster.client().await.unwrap(),
        realapi_support::NAMESPACE,
    )
    .get("milan")
    .await
    .unwrap();
    let pods = &te.spec.remote_pod_cidrs[0];
    assert_eq!(pods.real, layout.milan);
    assert_eq!(
        pods.view == pods.real,
        layout.rome != layout.milan,
        "Rome's view of Milan's pods: {pods:?}"
    );
    std::fs::create_dir_all(work).unwrap();
    let kubeconfig = work.join("kubeconfig");
    mcs::merged_kubeconfig(&[("milan", &milan_k), ("rome", &rome_k)], &kubeconfig).unwrap();
    let (report, took, _) = mcs::run(
        suite,
        work,
        &kubeconfig,
        &["milan", "rome"],
        mcs::WITHOUT_PODS,
        1,
    )
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", layout.title));
    for task in tasks {
        task.abort();
    }
    println!(
        "MCS conformance, {}: {} of {} passed in {took:.1?}",
        layout.title, report.passed, report.total
    );
    Some((report, took))
}

/// The Markdown report of every layout.
fn render(results: &[(&Layout, Report, Duration)]) -> String {
    let mut md = String::from(
        "# MCS API conformance\n\n\
         The upstream suite (kubernetes-sigs/mcs-api `conformance/` at ded161af, ServiceImport \
         and ServiceExport `v1beta1`) run against two clusters, `milan` (the suite's first, \
         \"remote\" cluster) and `rome`: real kube-apiservers with kube-controller-manager and \
         fake-kubelet, kubetun's CRDs and RBAC, linked with `kubetun network connect`, each \
         cluster's services loop running as the controller's ServiceAccount. Regenerated by \
         `KUBETUN_WRITE_CONFORMANCE=1 cargo test -p kubetun-controller --test realapi \
         conformance -- --nocapture`; CI runs the same test and fails when a spec that should \
         run does not pass.\n\n\
         Not run here (`-ginkgo.label-filter='!Connectivity && !DNS'`): the specs labelled \
         `Connectivity` or `DNS` send traffic and `clusterset.local` lookups from a request pod \
         with `kubectl exec`, which needs pods that really run; fake-kubelet only marks pods \
         Running. They run, with the whole suite, on real nodes: \
         [conformance-real-nodes.md](conformance-real-nodes.md). For the same reason the \
         Required spec \"Connectivity to a service that is not exported should be \
         inaccessible\", which carries neither label, passes here without reaching a pod (its \
         `kubectl exec` finds no kubelet, so nothing answers, which is what it checks); on real \
         nodes it runs for real.\n",
    );
    for (layout, report, took) in results {
        md.push_str(&mcs::render_section(layout.title, report, *took));
    }
    md
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcs_conformance_suite_passes_without_running_pods_in_both_layouts() {
    let _turn = kubetun_testenv::turn(module_path!());
    let suite = match mcs::suite_binary() {
        Ok(suite) => suite,
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping the MCS conformance suite: {e}");
            return;
        }
    };
    let out = repo_root().join("target/mcs-conformance");
    let mut results = Vec::new();
    for (index, layout) in LAYOUTS.iter().enumerate() {
        let work = out.join(format!("layout-{index}"));
        let _ = std::fs::remove_dir_all(&work);
        let Some((report, took)) = run_layout(&suite, layout, &work).await else {
            return;
        };
        results.push((layout, report, took));
    }
    let md = render(&results);
    std::fs::write(out.join("conformance.md"), &md).unwrap();
    if std::env::var_os("KUBETUN_WRITE_CONFORMANCE").is_some_and(|v| v == "1") {
        std::fs::write(repo_root().join("docs/conformance.md"), &md).unwrap();
    }
    for (layout, report, _) in &results {
        let failed = mcs::failures(report);
        assert!(
            failed.is_empty(),
            "{}: {} spec(s) failed (logs in target/mcs-conformance/):\n{}",
            layout.title,
            failed.len(),
            failed.join("\n")
        );
        assert_eq!(
            report.total,
            mcs::TOTAL,
            "{}: the suite's specs",
            layout.title
        );
        assert_eq!(
            mcs::ran(report),
            EXPECTED_RUN,
            "{}: specs run",
            layout.title
        );
        assert_eq!(
            report.passed, EXPECTED_RUN,
            "{}: specs passed",
            layout.title
        );
    }
}

//! kubetun as deployed, on real nodes: the lab of `kubetun-lab up --nodes` (the seed's four
//! clusters, two real nodes each, kubetun installed from the image of this build as the pods
//! `kubetun install` creates) must pass every check, and then the MCS API's upstream
//! conformance suite runs in full (all 27 specs, `Connectivity` and `DNS` included) against
//! Milan (its "remote" cluster) and Rome, linked by the hub's shortcut, with the two images it
//! asks for built locally from Debian packages (`testenv/images/build-conformance-images`).
//! Figures (time to ready clusters, installs, each check) are printed; the report goes to
//! `target/mcs-conformance/real-nodes/` (and with `KUBETUN_WRITE_CONFORMANCE=1` into
//! `docs/conformance-real-nodes.md`). Needs root; under CI=true it fails instead of skipping.
//! Everything it starts is stopped by its directories at the end, also when it fails.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kubetun_integration::netns::{bin_path, require_root};
use kubetun_integration::nodes::{self, NodeLabOptions};
use kubetun_testenv::mcs;

/// Removes the lab when dropped (also on a failed assertion).
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = nodes::down(&self.0, &mut std::io::sink());
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The suite's two images, built once into `target/conformance-images/`.
fn conformance_images() -> Result<Vec<PathBuf>, String> {
    let out = repo().join("target/conformance-images");
    let status = std::process::Command::new(repo().join("testenv/images/build-conformance-images"))
        .arg(&out)
        .status()
        .map_err(|e| format!("build-conformance-images: {e}"))?;
    if !status.success() {
        return Err(format!("build-conformance-images failed: {status}"));
    }
    Ok(vec![out.join("socat.tar"), out.join("netshoot.tar")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubetun_as_installed_on_real_nodes_passes_the_lab_and_the_whole_mcs_suite() {
    let _turn = kubetun_testenv::turn(module_path!());
    if !require_root("real_nodes") {
        return;
    }
    let missing = nodes::kit::missing_tools();
    if !missing.is_empty() {
        let reason = format!("missing {}", missing.join(", "));
        assert!(!kubetun_testenv::required(), "CI=true: {reason}");
        eprintln!("SKIPPED real_nodes: {reason}");
        return;
    }
    let suite = mcs::suite_binary().unwrap_or_else(|e| panic!("{e}"));
    let images = conformance_images().unwrap_or_else(|e| panic!("{e}"));
    // Short: node directories must stay under 80 characters (socket paths below them).
    let state = tempfile::Builder::new()
        .prefix("ktn")
        .tempdir_in("/tmp")
        .unwrap();
    let _down = Down(state.path().to_owned());
    let binaries = bin_path("kubetun").parent().map(Path::to_owned).unwrap();
    let options = NodeLabOptions {
        state_dir: state.path().to_owned(),
        binaries,
        clusters: nodes::SEED.to_vec(),
    };
    let started = Instant::now();
    let mut out = std::io::stdout();
    let report = tokio::task::block_in_place(|| nodes::up(&options, &mut out))
        .unwrap_or_else(|e| panic!("the lab on real nodes: {e}"));
    println!(
        "lab on real nodes up and checked in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for (what, took) in &report.timings {
        println!("  {what}: {:.1} s", took.as_secs_f64());
    }
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {} — {}", c.phase, c.description, c.detail))
        .collect();
    assert!(failed.is_empty(), "checks failed:\n{}", failed.join("\n"));

    // The whole suite against Milan and Rome.
    let cluster = |id: &str| {
        report
            .clusters
            .iter()
            .find(|c| c.spec.id == id)
            .unwrap_or_else(|| panic!("no cluster {id}"))
            .clone()
    };
    let (milan, rome) = (cluster("milan"), cluster("rome"));
    for c in [&milan, &rome] {
        for node in ["gw", "wk"] {
            let node_dir = c.dir.join(node).to_string_lossy().into_owned();
            let mut args = vec!["load".to_owned(), node_dir];
            args.extend(images.iter().map(|i| i.to_string_lossy().into_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            nodes::kit::run("kube-test-node", &args, &[]).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let work = repo().join("target/mcs-conformance/real-nodes");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let kubeconfig = work.join("kubeconfig");
    mcs::merged_kubeconfig(
        &[("milan", &milan.kubeconfig), ("rome", &rome.kubeconfig)],
        &kubeconfig,
    )
    .unwrap();
    // One retry per spec: the suite's own socat listener loses a reply now and then on a
    // loaded 2-vCPU machine (socat 1.7.4.4 exits on EPIPE before relaying `pod ip`); the
    // report names every spec that needed it.
    let (suite_report, took, retried) =
        mcs::run(&suite, &work, &kubeconfig, &["milan", "rome"], "", 2)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "MCS conformance on real nodes: {} of {} passed in {took:.1?}",
        suite_report.passed, suite_report.total
    );
    let md = format!(
        "# MCS API conformance on real nodes\n\n\
         The whole upstream suite (27 specs, `Connectivity` and `DNS` included) against Milan \
         (the suite's \"remote\" cluster) and Rome of `kubetun-lab up --nodes`: real kubelets, \
         kube-proxy and CNI, kubetun installed as pods from the image of this build, Rome and \
         Milan linked by the hub's shortcut, cluster DNS `nk-dns` forwarding \
         `clusterset.local` to kubetun DNS. Regenerated by `KUBETUN_WRITE_CONFORMANCE=1 cargo \
         test -p kubetun-integration --test e2e real_nodes -- --nocapture` (root).\n{}",
        mcs::render_section("Milan and Rome on real nodes", &suite_report, took)
    ) + &if retried.is_empty() {
        "\nNo spec needed its retry (`-ginkgo.flake-attempts=2`).\n".to_owned()
    } else {
        format!(
            "\nPassed on their second attempt (`-ginkgo.flake-attempts=2`): {}.\n",
            retried.join("; ")
        )
    };
    println!("specs that needed a retry: {retried:?}");
    std::fs::write(work.join("conformance.md"), &md).unwrap();
    if std::env::var_os("KUBETUN_WRITE_CONFORMANCE").is_some_and(|v| v == "1") {
        std::fs::write(repo().join("docs/conformance-real-nodes.md"), &md).unwrap();
    }
    let failed = mcs::failures(&suite_report);
    assert!(
        failed.is_empty(),
        "{} spec(s) failed on real nodes (logs in {}):\n{}",
        failed.len(),
        work.display(),
        failed.join("\n")
    );
    assert_eq!(mcs::ran(&suite_report), mcs::TOTAL, "every spec ran");
}

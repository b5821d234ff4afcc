//! Prints kubetun's CustomResourceDefinitions as multi-document YAML
//! (`cargo run -p kubetun-crds --bin crdgen > deploy/crds/kubetun.yaml`), or with the argument
//! `multicluster` those of the Multi-Cluster Services API
//! (`… --bin crdgen multicluster > deploy/crds/multicluster.yaml`).

fn main() {
    let which = std::env::args().nth(1);
    let yaml = match which.as_deref() {
        None => kubetun_crds::crds_yaml(),
        Some("multicluster") => kubetun_crds::mcs_crds_yaml(),
        Some(other) => {
            eprintln!("crdgen: unknown argument {other:?} (none, or `multicluster`)");
            std::process::exit(2);
        }
    };
    match yaml {
        Ok(yaml) => print!("{yaml}"),
        Err(err) => {
            eprintln!("crdgen: cannot render CRDs: {err}");
            std::process::exit(1);
        }
    }
}

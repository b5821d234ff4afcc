//! Prints every kubetun CustomResourceDefinition as multi-document YAML
//! (`cargo run -p kubetun-crds --bin crdgen > deploy/crds/kubetun.yaml`).

fn main() {
    match kubetun_crds::crds_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(err) => {
            eprintln!("crdgen: cannot render CRDs: {err}");
            std::process::exit(1);
        }
    }
}

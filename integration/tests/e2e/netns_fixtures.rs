//! The fixtures themselves: a namespace pair joined by a veth passes traffic and disappears.

use kubetun_integration::netns::{Netns, require_root, veth};

#[test]
fn veth_pair_pings_and_namespaces_are_removed_on_drop() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("veth_pair_pings_and_namespaces_are_removed_on_drop") {
        return;
    }
    {
        let a = Netns::new("kt-fixture-a").unwrap();
        let b = Netns::new("kt-fixture-b").unwrap();
        veth(&a, "va", &b, "vb").unwrap();
        a.exec(&["ip", "addr", "add", "192.0.2.1/30", "dev", "va"])
            .unwrap();
        b.exec(&["ip", "addr", "add", "192.0.2.2/30", "dev", "vb"])
            .unwrap();
        assert!(a.ping("192.0.2.2", 1), "veth peer must answer");
        let mut sleeper = b.spawn(&["sleep", "30"]).unwrap();
        assert!(sleeper.is_running());
    }
    let list = kubetun_integration::netns::ip(&["netns", "list"]).unwrap();
    assert!(
        !list.contains("kt-fixture-a") && !list.contains("kt-fixture-b"),
        "{list}"
    );
}

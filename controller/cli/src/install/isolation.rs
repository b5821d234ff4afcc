//! The cluster's default isolation that `kubetun install` writes (`KUBETUN_ISOLATION` of the
//! controller's ConfigMap): what `--isolation` says, else what the cluster has, else
//! `exported` on a new install. A cluster installed before the setting existed has no key
//! and stays `open`, as its links were.

use std::collections::BTreeMap;

use kubetun_crds::Isolation;

/// The controller's ConfigMap key of the cluster's default isolation (the controller's
/// `--isolation`).
pub const ISOLATION_KEY: &str = "KUBETUN_ISOLATION";

/// The isolation of a new install.
pub const NEW_INSTALL: Isolation = Isolation::Exported;

/// Parses `--isolation` (and the ConfigMap's value): `open` or `exported`.
pub fn parse_isolation(text: &str) -> Result<Isolation, String> {
    text.parse()
}

/// The isolation to write and why (the line install prints). `installed` is the data of
/// the controller's ConfigMap, `None` on a new install.
pub fn choose(
    flag: Option<Isolation>,
    installed: Option<&BTreeMap<String, String>>,
) -> Result<(Isolation, String), String> {
    if let Some(given) = flag {
        return Ok((given, format!("isolation: {given} (--isolation)")));
    }
    let Some(installed) = installed else {
        return Ok((
            NEW_INSTALL,
            format!(
                "isolation: {NEW_INSTALL} (the default of a new install: a peer reaches only \
                 the Services exported to it; --isolation open opens every pod to linked \
                 clusters)"
            ),
        ));
    };
    match installed.get(ISOLATION_KEY) {
        Some(value) => {
            let isolation = parse_isolation(value.trim()).map_err(|why| {
                format!(
                    "ConfigMap kubetun-controller-config has {ISOLATION_KEY}: {value:?} ({why}); \
                     pass --isolation open or --isolation exported"
                )
            })?;
            Ok((
                isolation,
                format!("isolation: {isolation} (the installed one; --isolation changes it)"),
            ))
        }
        None => Ok((
            Isolation::Open,
            "isolation: open (installed before isolation existed: its links stay open; \
             --isolation exported lets peers reach only the Services exported to them)"
                .to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_new_install_is_exported_and_an_old_one_stays_open() {
        let (fresh, why) = choose(None, None).unwrap();
        assert_eq!(fresh, Isolation::Exported);
        assert!(why.contains("default of a new install"), "{why}");

        let old = data(&[("KUBETUN_CLUSTER_ID", "rome")]);
        let (kept, why) = choose(None, Some(&old)).unwrap();
        assert_eq!(kept, Isolation::Open);
        assert!(why.contains("installed before isolation existed"), "{why}");
    }

    #[test]
    fn a_reinstall_keeps_what_the_cluster_has_unless_the_flag_says_otherwise() {
        for (value, wanted) in [("open", Isolation::Open), ("exported", Isolation::Exported)] {
            let installed = data(&[(ISOLATION_KEY, value)]);
            assert_eq!(choose(None, Some(&installed)).unwrap().0, wanted);
        }
        let installed = data(&[(ISOLATION_KEY, "exported")]);
        let (given, why) = choose(Some(Isolation::Open), Some(&installed)).unwrap();
        assert_eq!(given, Isolation::Open);
        assert_eq!(why, "isolation: open (--isolation)");
        // The flag wins over a broken value too.
        let broken = data(&[(ISOLATION_KEY, "closed")]);
        assert!(choose(Some(Isolation::Exported), Some(&broken)).is_ok());
    }

    #[test]
    fn a_broken_installed_value_is_refused_with_the_way_out() {
        let broken = data(&[(ISOLATION_KEY, "closed")]);
        let error = choose(None, Some(&broken)).unwrap_err();
        assert!(error.contains("\"closed\""), "{error}");
        assert!(error.contains("expected `open` or `exported`"), "{error}");
        assert!(error.contains("pass --isolation"), "{error}");
    }

    #[test]
    fn only_open_and_exported_parse() {
        assert_eq!(parse_isolation("open"), Ok(Isolation::Open));
        assert_eq!(parse_isolation("exported"), Ok(Isolation::Exported));
        for bad in ["", "Open", "closed", "export"] {
            let error = parse_isolation(bad).unwrap_err();
            assert!(
                error.contains("expected `open` or `exported`"),
                "{bad:?}: {error}"
            );
        }
    }
}

//! Which modules of a library crate other crates may name: a program's internals stay its own.

/// `(crate, module)`: a module of a library crate that only that crate and the crates listed
/// may name.
pub const INTERNAL: &[(&str, &str, &[&str])] = &[];

/// The rule a path breaks, if any: `crate_name` names `path` (`[crate, module, ...]`).
pub fn breaks(crate_name: &str, path: &[String]) -> Option<String> {
    let (target, module) = (path.first()?, path.get(1)?);
    INTERNAL
        .iter()
        .find(|(c, m, allowed)| {
            c.replace('-', "_") == *target
                && m == module
                && c.replace('-', "_") != crate_name
                && !allowed.iter().any(|a| a.replace('-', "_") == crate_name)
        })
        .map(|(c, m, _)| format!("{c}'s `{m}` is internal to it"))
}

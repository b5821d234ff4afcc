//! Where a path named in a module leads: to a module of the same crate (through child
//! modules, `super`, imports and re-exports, as name resolution does), or out of the crate.

use crate::tree::{ModPath, Tree};

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The module of this crate that defines the item (or is the module named).
    Local(ModPath),
    /// Another crate: its name first, then the path inside it.
    External(Vec<String>),
    /// Not found (`Self`, generics, macro-made names, a re-export loop).
    Unknown,
}

/// How many re-exports a path may pass through before it counts as a loop.
const MAX_HOPS: usize = 32;

/// Resolves `path` as written in module `from`.
pub fn resolve(tree: &Tree, from: &[String], path: &[String]) -> Place {
    resolve_in(tree, from, path, 0)
}

fn resolve_in(tree: &Tree, from: &[String], path: &[String], hops: usize) -> Place {
    if hops > MAX_HOPS {
        return Place::Unknown;
    }
    let Some((first, rest)) = path.split_first() else {
        return Place::Local(from.to_vec());
    };
    let Some(module) = tree.modules.get(from) else {
        return Place::Unknown;
    };
    match first.as_str() {
        "" => Place::External(rest.to_vec()),
        "crate" => walk(tree, Vec::new(), rest, hops),
        "self" => walk(tree, from.to_vec(), rest, hops),
        "super" => walk(tree, parent(from), rest, hops),
        "Self" => Place::Unknown,
        name if module.children.contains(name) => walk(tree, from.to_vec(), path, hops),
        name => {
            if let Some(place) = through_import(tree, from, name, rest, hops) {
                place
            } else if module.defines.contains(name) {
                Place::Local(from.to_vec())
            } else {
                Place::External(path.to_vec())
            }
        }
    }
}

/// Follows `rest` down from module `cur`.
fn walk(tree: &Tree, mut cur: ModPath, mut rest: &[String], hops: usize) -> Place {
    while let Some((seg, tail)) = rest.split_first() {
        let Some(module) = tree.modules.get(&cur) else {
            return Place::Unknown;
        };
        match seg.as_str() {
            "super" => cur = parent(&cur),
            "self" => {}
            name if module.children.contains(name) => cur.push(name.to_string()),
            name if module.defines.contains(name) => return Place::Local(cur),
            name => {
                if let Some(place) = through_import(tree, &cur, name, tail, hops) {
                    return place;
                }
                // A name a glob brings in: the first glob whose module has it.
                for glob in module.imports.iter().filter(|i| i.name.is_none()) {
                    let joined: Vec<String> = glob.path.iter().chain(rest).cloned().collect();
                    if let Place::Local(there) = resolve_in(tree, &cur, &joined, hops + 1)
                        && there != cur
                    {
                        return Place::Local(there);
                    }
                }
                return Place::Local(cur);
            }
        }
        rest = tail;
    }
    Place::Local(cur)
}

/// Where `name` followed by `rest` leads when module `module` imports `name`.
fn through_import(
    tree: &Tree,
    module: &[String],
    name: &str,
    rest: &[String],
    hops: usize,
) -> Option<Place> {
    let import = tree
        .modules
        .get(module)?
        .imports
        .iter()
        .find(|i| i.name.as_deref() == Some(name))?;
    let joined: Vec<String> = import.path.iter().chain(rest).cloned().collect();
    Some(resolve_in(tree, module, &joined, hops + 1))
}

fn parent(path: &[String]) -> ModPath {
    path[..path.len().saturating_sub(1)].to_vec()
}

//! The arrows between the modules of one crate, drawn per floor, and the circles among them.
//!
//! For every module M, the nodes are M's own file (`(file)`) and each child of M with all
//! its descendants; an arrow A → B means code in A names an item that lives in B. A child
//! naming what its parent's own file defines is an arrow up to `(file)`, so a `mod.rs` is
//! either the floor above its children or the ground they stand on, never both.

use std::collections::{BTreeMap, BTreeSet};

use crate::resolve::{Place, resolve};
use crate::tree::{ModPath, Tree};

/// The node for a module's own file.
pub const FILE: &str = "(file)";

/// One circle of arrows among the nodes of one floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The module whose floor it is (`[]`: the crate root).
    pub floor: ModPath,
    /// The nodes in the circle.
    pub members: Vec<String>,
    /// Each arrow inside it, with one place that draws it: `(from, to, "file names path")`.
    pub arrows: Vec<(String, String, String)>,
}

/// A path one module names in another crate: `(module's file, [crate, path...])`.
pub type Outward = (String, Vec<String>);

/// The circles of a crate and the paths it names in other crates.
pub fn analyse(tree: &Tree) -> (Vec<Cycle>, Vec<Outward>) {
    // floor -> (from, to) -> an example
    let mut floors: BTreeMap<ModPath, BTreeMap<(String, String), String>> = BTreeMap::new();
    let mut outward = Vec::new();
    for (from, module) in &tree.modules {
        let file = module.file.display().to_string();
        let named = module
            .imports
            .iter()
            .map(|i| &i.path)
            .chain(module.paths.iter());
        for path in named {
            match resolve(tree, from, path) {
                Place::Local(to) => {
                    if let Some((floor, a, b)) = arrow(from, &to) {
                        floors
                            .entry(floor)
                            .or_default()
                            .entry((a, b))
                            .or_insert_with(|| format!("{file} names {}", path.join("::")));
                    }
                }
                Place::External(p) => outward.push((file.clone(), p)),
                Place::Unknown => {}
            }
        }
    }
    let mut cycles = Vec::new();
    for (floor, arrows) in floors {
        for members in strongly_connected(&arrows) {
            let inside: BTreeSet<&String> = members.iter().collect();
            let arrows = arrows
                .iter()
                .filter(|((a, b), _)| inside.contains(a) && inside.contains(b))
                .map(|((a, b), ex)| (a.clone(), b.clone(), ex.clone()))
                .collect();
            cycles.push(Cycle {
                floor: floor.clone(),
                members,
                arrows,
            });
        }
    }
    (cycles, outward)
}

/// The floor an arrow from module `from` to module `to` is drawn on, and its two nodes.
fn arrow(from: &[String], to: &[String]) -> Option<(ModPath, String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let node = |p: &[String]| p.get(common).cloned().unwrap_or_else(|| FILE.to_string());
    let (a, b) = (node(from), node(to));
    (a != b).then(|| (from[..common].to_vec(), a, b))
}

/// Tarjan's strongly connected components with more than one node.
fn strongly_connected(arrows: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in arrows.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct State<'a> {
        next: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &s.next[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut members = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                members.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if members.len() > 1 {
                members.sort();
                s.out.push(members);
            }
        }
    }
    let mut s = State {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

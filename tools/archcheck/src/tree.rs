//! A crate's module tree as the compiler sees it (from the root file through every `mod`),
//! with what each module defines, imports and names. Test code (`#[cfg(test)]`, modules named
//! `tests`) is left out: tests may use whatever they test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::visit::Visit;

use crate::error::Error;

/// A module's place in its crate: the names from the crate root (`[]` is the root).
pub type ModPath = Vec<String>;

/// One `use` leaf: `use a::b::C as D;` is `name: Some("D")`, `path: [a, b, C]`.
#[derive(Debug, Clone)]
pub struct Import {
    /// The name it binds; `None` for a glob (`use a::b::*`) or `as _`.
    pub name: Option<String>,
    /// The path as written (relative to the module that has the `use`).
    pub path: Vec<String>,
}

/// What one module is made of.
#[derive(Debug, Default)]
pub struct Module {
    /// Its file (an inline module's is its parent's).
    pub file: PathBuf,
    /// Its direct child modules (test modules excluded).
    pub children: BTreeSet<String>,
    /// The names its own items define (types, functions, traits, constants, macros).
    pub defines: BTreeSet<String>,
    /// Its `use` leaves.
    pub imports: Vec<Import>,
    /// Every path of two or more segments its code names (outside `use`).
    pub paths: Vec<Vec<String>>,
}

/// A crate's modules by path.
#[derive(Debug, Default)]
pub struct Tree {
    /// Every module, the root included.
    pub modules: BTreeMap<ModPath, Module>,
}

impl Tree {
    /// Reads the crate whose root file is `root` (`src/lib.rs`, `src/main.rs`, ...).
    pub fn load(root: &Path) -> Result<Tree, Error> {
        let mut tree = Tree::default();
        let file = parse(root)?;
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        tree.add(Vec::new(), root, &dir, &file.items)?;
        Ok(tree)
    }

    fn add(
        &mut self,
        path: ModPath,
        file: &Path,
        child_dir: &Path,
        items: &[syn::Item],
    ) -> Result<(), Error> {
        let mut module = Module {
            file: file.to_path_buf(),
            ..Module::default()
        };
        let mut facts = Facts::default();
        for item in items {
            if is_test(item_attrs(item)) {
                continue;
            }
            if let syn::Item::Mod(m) = item {
                let name = m.ident.to_string();
                if name == "tests" || name == "test" {
                    continue;
                }
                module.children.insert(name.clone());
                module.defines.insert(name.clone());
                let mut child = path.clone();
                child.push(name.clone());
                match &m.content {
                    Some((_, inner)) => self.add(child, file, &child_dir.join(&name), inner)?,
                    None => {
                        let (child_file, grandchild_dir) = locate(file, child_dir, m)?;
                        let parsed = parse(&child_file)?;
                        self.add(child, &child_file, &grandchild_dir, &parsed.items)?;
                    }
                }
                continue;
            }
            if let Some(name) = item_name(item) {
                module.defines.insert(name);
            }
            facts.visit_item(item);
        }
        module.imports = facts.imports;
        module.paths = facts.paths;
        self.modules.insert(path, module);
        Ok(())
    }
}

fn parse(path: &Path) -> Result<syn::File, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    syn::parse_file(&text).map_err(|e| Error::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The file of `mod name;` and the directory its own children live in.
fn locate(parent: &Path, dir: &Path, m: &syn::ItemMod) -> Result<(PathBuf, PathBuf), Error> {
    let name = m.ident.to_string();
    for attr in &m.attrs {
        if let syn::Meta::NameValue(nv) = &attr.meta
            && nv.path.is_ident("path")
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            let base = parent.parent().unwrap_or(Path::new("."));
            let file = base.join(s.value());
            let dir = file.with_extension("");
            return Ok((file, dir));
        }
    }
    let flat = dir.join(format!("{name}.rs"));
    if flat.is_file() {
        return Ok((flat, dir.join(&name)));
    }
    let nested = dir.join(&name).join("mod.rs");
    if nested.is_file() {
        return Ok((nested, dir.join(&name)));
    }
    Err(Error::MissingModule {
        parent: parent.to_path_buf(),
        name,
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    use syn::Item::*;
    let ident = match item {
        Const(i) => &i.ident,
        Enum(i) => &i.ident,
        Fn(i) => &i.sig.ident,
        Macro(i) => i.ident.as_ref()?,
        Static(i) => &i.ident,
        Struct(i) => &i.ident,
        Trait(i) => &i.ident,
        TraitAlias(i) => &i.ident,
        Type(i) => &i.ident,
        Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `#[cfg(test)]`, `#[cfg(all(test, ...))]` and the like: code that only tests compile.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let tokens = a.meta.to_token_stream().to_string();
            tokens
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "test")
                && !tokens.contains("not (test")
                && !tokens.contains("not(test")
        }
    })
}

/// The imports and paths of one module's own items.
#[derive(Default)]
struct Facts {
    imports: Vec<Import>,
    paths: Vec<Vec<String>>,
}

impl Facts {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut path = prefix.clone();
                if name == "self" {
                    // `use a::b::{self}` binds `b`.
                    let bound = path.last().cloned();
                    self.imports.push(Import { name: bound, path });
                } else {
                    path.push(name.clone());
                    self.imports.push(Import {
                        name: Some(name),
                        path,
                    });
                }
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                let name = (r.rename != "_").then(|| r.rename.to_string());
                self.imports.push(Import { name, path });
            }
            syn::UseTree::Glob(_) => self.imports.push(Import {
                name: None,
                path: prefix.clone(),
            }),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Facts {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test(item_attrs(item)) {
            return;
        }
        match item {
            // Inline modules are modules of their own.
            syn::Item::Mod(_) => {}
            syn::Item::Use(u) => {
                let mut prefix = Vec::new();
                if u.leading_colon.is_some() {
                    prefix.push(String::new());
                }
                self.use_tree(&mut prefix, &u.tree);
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        // A `use` inside a function body imports for that body only, the same for the arrows.
        if let syn::Stmt::Item(syn::Item::Use(u)) = stmt {
            let mut prefix = Vec::new();
            self.use_tree(&mut prefix, &u.tree);
            return;
        }
        syn::visit::visit_stmt(self, stmt);
    }

    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {
        // `pub(in crate::a)` names where an item may be seen, not something it uses.
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() >= 2 && path.leading_colon.is_none() {
            self.paths
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Most macro bodies (format!, assert!, vec!, select! arms aside) are expressions.
        use syn::punctuated::Punctuated;
        let parser = Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(exprs) = syn::parse::Parser::parse2(parser, mac.tokens.clone()) {
            for expr in &exprs {
                self.visit_expr(expr);
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}

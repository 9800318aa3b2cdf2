//! A crate's module graph as its non-test code names it, and the import cycles in it.
//!
//! The tree is read from a crate root (`lib.rs`, `main.rs`, a `src/bin` file) through its
//! `mod` items, skipping `#[cfg(test)]` items. Every path the code writes (`use` trees, paths in
//! expressions, types and patterns, `crate::`… in macro arguments and in attribute strings such
//! as serde's `with`) is resolved through the modules' own items, imports and glob imports, so
//! a name reached through a `pub use` counts as a reference to the module that defines it too.
//! A reference from anything inside module A to anything inside its sibling B is an edge A → B;
//! a module's references to its ancestors and descendants are not edges.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io,
    path::{Path, PathBuf},
};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::{punctuated::Punctuated, visit::Visit};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("parsing {}: {source}", path.display())]
    Parse { path: PathBuf, source: syn::Error },
    #[error("{}: `mod {name};` has neither {name}.rs nor {name}/mod.rs beside it", path.display())]
    MissingModule { path: PathBuf, name: String },
}

/// One place in the code that makes an edge: the file, the line and the path as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reference {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// A module naming its sibling, with every place that does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub references: Vec<Reference>,
}

/// Sibling modules that reach each other: `modules` is one shortest circle through them
/// (first module repeated at the end), `edges` every edge between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub modules: Vec<String>,
    pub edges: Vec<Edge>,
}

/// Module paths as the graph's nodes: `chaos::checks`, `crate` for the root.
fn shown(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

#[derive(Debug, Default)]
struct Module {
    path: Vec<String>,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Names of the items defined here (functions, types, traits, consts, macros…).
    items: BTreeSet<String>,
    /// `use` declarations: the name each brings in and the path it was written with.
    imports: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

/// A path as written in a module.
#[derive(Debug)]
struct Written {
    module: usize,
    segments: Vec<String>,
    file: PathBuf,
    line: usize,
}

/// Where a path leads: a module, or an item defined in one.
#[derive(Debug, Clone, Copy)]
enum Resolved {
    Module(usize),
    ItemIn(usize),
}

impl Resolved {
    fn module(self) -> usize {
        match self {
            Resolved::Module(m) | Resolved::ItemIn(m) => m,
        }
    }
}

/// How many `use` hops a name may take before it counts as unresolved (a loop of re-exports).
const MAX_HOPS: usize = 16;

/// The module tree of one crate root and the paths its non-test code writes.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    modules: Vec<Module>,
    written: Vec<Written>,
}

impl ModuleGraph {
    /// Reads the tree from `root` (a `lib.rs`, `main.rs` or `src/bin` file).
    pub fn read(root: &Path) -> Result<Self, Error> {
        let mut graph = ModuleGraph {
            modules: vec![Module::default()],
            written: Vec::new(),
        };
        let file = parse(root)?;
        let children_dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        graph.read_items(0, &file.items, root, &children_dir)?;
        Ok(graph)
    }

    fn read_items(
        &mut self,
        module: usize,
        items: &[syn::Item],
        file: &Path,
        children_dir: &Path,
    ) -> Result<(), Error> {
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(declared) => {
                    let name = declared.ident.to_string();
                    let mut path = self.modules[module].path.clone();
                    path.push(name.clone());
                    let child = self.modules.len();
                    self.modules.push(Module {
                        path,
                        parent: Some(module),
                        ..Module::default()
                    });
                    self.modules[module].children.insert(name.clone(), child);
                    let grandchildren_dir = children_dir.join(&name);
                    match &declared.content {
                        Some((_, inline)) => {
                            self.read_items(child, inline, file, &grandchildren_dir)?
                        }
                        None => {
                            let child_file = module_file(file, children_dir, &name)?;
                            let parsed = parse(&child_file)?;
                            self.read_items(child, &parsed.items, &child_file, &grandchildren_dir)?
                        }
                    }
                }
                syn::Item::Use(declared) => {
                    let mut leaves = Vec::new();
                    use_leaves(&declared.tree, &mut Vec::new(), &mut leaves);
                    let target = &mut self.modules[module];
                    for leaf in leaves {
                        match leaf {
                            UseLeaf::Name { name, path, .. } if name != "_" => {
                                target.imports.insert(name, path);
                            }
                            UseLeaf::Name { .. } => {}
                            UseLeaf::Glob { path, .. } => target.globs.push(path),
                        }
                    }
                    self.collect_written(module, file, |v| v.visit_item(item));
                }
                _ => {
                    if let Some(name) = item_name(item) {
                        self.modules[module].items.insert(name);
                    }
                    self.collect_written(module, file, |v| v.visit_item(item));
                }
            }
        }
        Ok(())
    }

    fn collect_written(&mut self, module: usize, file: &Path, visit: impl FnOnce(&mut Paths)) {
        let mut paths = Paths::default();
        visit(&mut paths);
        self.written
            .extend(paths.found.into_iter().map(|(segments, line)| Written {
                module,
                segments,
                file: file.to_path_buf(),
                line,
            }));
    }

    /// The import cycles between sibling modules, each with its edges.
    pub fn cycles(&self) -> Vec<Cycle> {
        let edges = self.edges();
        let mut successors: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (from, to) in edges.keys() {
            successors.entry(from).or_default().insert(to);
            successors.entry(to).or_default();
        }
        strongly_connected(&successors)
            .into_iter()
            .filter(|component| component.len() > 1)
            .map(|component| {
                let inside = |(from, to): &(String, String)| {
                    component.contains(from.as_str()) && component.contains(to.as_str())
                };
                Cycle {
                    modules: shortest_circle(&successors, &component),
                    edges: edges
                        .iter()
                        .filter(|(pair, _)| inside(pair))
                        .map(|((from, to), references)| Edge {
                            from: from.clone(),
                            to: to.clone(),
                            references: references.iter().cloned().collect(),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Every sibling edge, keyed by (from, to), with the places that make it.
    fn edges(&self) -> BTreeMap<(String, String), BTreeSet<Reference>> {
        let mut edges: BTreeMap<(String, String), BTreeSet<Reference>> = BTreeMap::new();
        for written in &self.written {
            // A lone name this module imports makes the edges its `use` already made.
            if let [name] = written.segments.as_slice()
                && self.modules[written.module].imports.contains_key(name)
            {
                continue;
            }
            let mut reached = Vec::new();
            let Some(target) =
                self.resolve(written.module, &written.segments, &mut reached, MAX_HOPS)
            else {
                continue;
            };
            // A lone name that leads to a module is not a use of it (a local variable shares
            // a name with a module brought in by a glob); a module is only ever named in a path.
            if written.segments.len() == 1 && matches!(target, Resolved::Module(_)) {
                continue;
            }
            reached.push(target.module());
            let from = &self.modules[written.module].path;
            for module in reached {
                if let Some(pair) = sibling_edge(from, &self.modules[module].path) {
                    edges.entry(pair).or_default().insert(Reference {
                        file: written.file.clone(),
                        line: written.line,
                        path: written.segments.join("::"),
                    });
                }
            }
        }
        edges
    }

    /// Where `segments`, written in module `from`, lead; every module a `use` hop passes
    /// through is added to `reached`. `None` for what is not this crate's (another crate, a
    /// local name, `Self`).
    fn resolve(
        &self,
        from: usize,
        segments: &[String],
        reached: &mut Vec<usize>,
        hops: usize,
    ) -> Option<Resolved> {
        let first = segments.first()?;
        let (mut at, rest, relative) = match first.as_str() {
            "crate" => (0, &segments[1..], false),
            "self" => (from, &segments[1..], false),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let mut at = from;
                for _ in 0..supers {
                    at = self.modules[at].parent?;
                }
                (at, &segments[supers..], false)
            }
            _ => (from, segments, true),
        };
        let mut found = Resolved::Module(at);
        for (i, segment) in rest.iter().enumerate() {
            match self.lookup(at, segment, reached, hops) {
                Some(Resolved::Module(module)) => {
                    at = module;
                    found = Resolved::Module(module);
                }
                Some(item) => return Some(item),
                // An enum's variant, an associated item, or an item a macro defines: it lives
                // in the module reached so far.
                None if i > 0 || !relative => return Some(Resolved::ItemIn(at)),
                None => return None,
            }
        }
        Some(found)
    }

    /// What `name` means inside module `at`: its child module, its own item, its import or a
    /// name one of its glob imports brings. `at` and every module a hop passes through are
    /// added to `reached` when the name is found.
    fn lookup(
        &self,
        at: usize,
        name: &str,
        reached: &mut Vec<usize>,
        hops: usize,
    ) -> Option<Resolved> {
        let module = &self.modules[at];
        let found = if let Some(&child) = module.children.get(name) {
            Resolved::Module(child)
        } else if module.items.contains(name) {
            Resolved::ItemIn(at)
        } else {
            let hops = hops.checked_sub(1)?;
            if let Some(path) = module.imports.get(name) {
                self.resolve(at, path, reached, hops)?
            } else {
                module.globs.iter().find_map(|glob| {
                    let mut via = Vec::new();
                    let Resolved::Module(source) = self.resolve(at, glob, &mut via, hops)? else {
                        return None;
                    };
                    let found = self.lookup(source, name, &mut via, hops)?;
                    reached.extend(via);
                    Some(found)
                })?
            }
        };
        reached.push(at);
        Some(found)
    }
}

/// The edge a reference from module `from` to module `to` makes: the two sibling modules
/// (under their nearest common ancestor) that contain them, or `None` when one contains the
/// other.
fn sibling_edge(from: &[String], to: &[String]) -> Option<(String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    (common < from.len() && common < to.len())
        .then(|| (shown(&from[..=common]), shown(&to[..=common])))
}

/// `name.rs` or `name/mod.rs` in `children_dir`.
fn module_file(declaring: &Path, children_dir: &Path, name: &str) -> Result<PathBuf, Error> {
    [
        children_dir.join(format!("{name}.rs")),
        children_dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|candidate| candidate.is_file())
    .ok_or_else(|| Error::MissingModule {
        path: declaring.to_path_buf(),
        name: name.to_owned(),
    })
}

fn parse(path: &Path) -> Result<syn::File, Error> {
    let source = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    syn::parse_file(&source).map_err(|source| Error::Parse {
        path: path.to_path_buf(),
        source,
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
        ExternCrate(i) => i.rename.as_ref().map_or(&i.ident, |(_, rename)| rename),
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

/// Whether `attrs` hold a `#[cfg(…)]` that only a test build meets (`test`, `all(test, …)`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    fn needs_test(predicate: &syn::Meta) -> bool {
        match predicate {
            syn::Meta::Path(path) => path.is_ident("test"),
            syn::Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
                .is_ok_and(|all| all.iter().any(needs_test)),
            _ => false,
        }
    }
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|predicate| needs_test(&predicate))
    })
}

/// A leaf of a `use` tree, with the line it is on.
enum UseLeaf {
    Name {
        name: String,
        path: Vec<String>,
        line: usize,
    },
    Glob {
        path: Vec<String>,
        line: usize,
    },
}

/// The leaves of a `use` tree: `use a::{b, c::d as e, f::*}` is b, e and a glob of `a::f`.
fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, leaves: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_leaves(&path.tree, prefix, leaves);
            prefix.pop();
        }
        syn::UseTree::Name(leaf) => {
            let ident = leaf.ident.to_string();
            // `use a::b::{self}` brings `b`.
            let (name, path) = if ident == "self" {
                (prefix.last().cloned().unwrap_or_default(), prefix.clone())
            } else {
                let mut path = prefix.clone();
                path.push(ident.clone());
                (ident, path)
            };
            let line = name_line(&leaf.ident);
            leaves.push(UseLeaf::Name { name, path, line });
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            let ident = rename.ident.to_string();
            if ident != "self" {
                path.push(ident);
            }
            leaves.push(UseLeaf::Name {
                name: rename.rename.to_string(),
                path,
                line: name_line(&rename.ident),
            });
        }
        syn::UseTree::Glob(glob) => leaves.push(UseLeaf::Glob {
            path: prefix.clone(),
            line: glob.star_token.span.start().line,
        }),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                use_leaves(tree, prefix, leaves);
            }
        }
    }
}

/// Collects the paths an item writes, with the line of each, outside `#[cfg(test)]` items.
#[derive(Default)]
struct Paths {
    found: Vec<(Vec<String>, usize)>,
}

impl Paths {
    fn push_path(&mut self, path: &syn::Path) {
        if path.leading_colon.is_some() {
            return; // `::name` is another crate
        }
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path.segments.first().map_or(0, |s| name_line(&s.ident));
        self.found.push((segments, line));
    }

    /// `a::b::c` runs in a macro's tokens (`sqlx::query_as!(crate::x::Row, …)`, `$crate::…`).
    fn push_token_paths(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(group) = &tokens[i] {
                self.push_token_paths(group.stream());
                i += 1;
                continue;
            }
            let after_colons = i >= 2 && is_path_separator(&tokens[i - 2], &tokens[i - 1]);
            let TokenTree::Ident(first) = &tokens[i] else {
                i += 1;
                continue;
            };
            let mut segments = vec![first.to_string()];
            let mut j = i + 1;
            while j + 1 < tokens.len() && is_path_separator(&tokens[j], &tokens[j + 1]) {
                match tokens.get(j + 2) {
                    Some(TokenTree::Ident(next)) => {
                        segments.push(next.to_string());
                        j += 3;
                    }
                    _ => break,
                }
            }
            if segments.len() > 1 && !after_colons {
                self.found.push((segments, name_line(first)));
            }
            i = j;
        }
    }

    /// Paths in attribute strings, such as serde's `with = "crate::money::serde"`.
    fn push_string_paths(&mut self, tokens: TokenStream) {
        for token in tokens {
            match token {
                TokenTree::Group(group) => self.push_string_paths(group.stream()),
                TokenTree::Literal(literal) => {
                    let Ok(text) = syn::parse2::<syn::LitStr>(TokenTree::Literal(literal).into())
                    else {
                        continue;
                    };
                    let value = text.value();
                    if ["crate::", "super::", "self::"]
                        .iter()
                        .any(|prefix| value.starts_with(prefix))
                        && let Ok(path) = syn::parse_str::<syn::Path>(&value)
                    {
                        let segments = path.segments.iter().map(|s| s.ident.to_string());
                        self.found
                            .push((segments.collect(), text.span().start().line));
                    }
                }
                _ => {}
            }
        }
    }
}

fn name_line(ident: &syn::Ident) -> usize {
    ident.span().start().line
}

fn is_path_separator(first: &TokenTree, second: &TokenTree) -> bool {
    matches!((first, second), (TokenTree::Punct(a), TokenTree::Punct(b))
        if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        // A module's items are read as that module's; a test-only item is not read.
        if matches!(item, syn::Item::Mod(_)) || is_test_only(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&item.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            let (UseLeaf::Name { path, line, .. } | UseLeaf::Glob { path, line }) = leaf;
            self.found.push((path, line));
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.push_path(path);
        syn::visit::visit_path(self, path);
    }

    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {
        // `pub(in crate::a)` names an ancestor: a limit, not a use.
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.push_path(&mac.path);
        self.push_token_paths(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Only list attributes (`#[serde(with = "…")]`): a doc comment's text is not code.
        if let syn::Meta::List(list) = &attr.meta {
            self.push_string_paths(list.tokens.clone());
        }
    }
}

/// Tarjan's strongly connected components of `successors`.
fn strongly_connected<'a>(
    successors: &BTreeMap<&'a str, BTreeSet<&'a str>>,
) -> Vec<BTreeSet<&'a str>> {
    struct State<'a, 'g> {
        successors: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<BTreeSet<&'a str>>,
    }
    fn connect<'a>(state: &mut State<'a, '_>, node: &'a str) {
        let order = state.index.len();
        state.index.insert(node, order);
        state.low.insert(node, order);
        state.stack.push(node);
        state.on_stack.insert(node);
        for &next in state.successors.get(node).into_iter().flatten() {
            if !state.index.contains_key(next) {
                connect(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.insert(member);
                if member == node {
                    break;
                }
            }
            state.components.push(component);
        }
    }
    let mut state = State {
        successors,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for &node in successors.keys() {
        if !state.index.contains_key(node) {
            connect(&mut state, node);
        }
    }
    state.components.sort();
    state.components
}

/// A shortest circle from the component's first module back to it, inside the component.
fn shortest_circle(
    successors: &BTreeMap<&str, BTreeSet<&str>>,
    component: &BTreeSet<&str>,
) -> Vec<String> {
    let Some(&start) = component.first() else {
        return Vec::new();
    };
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &next in successors.get(node).into_iter().flatten() {
            if !component.contains(next) || came_from.contains_key(next) {
                continue;
            }
            came_from.insert(next, node);
            if next == start {
                queue.clear();
                break;
            }
            queue.push_back(next);
        }
    }
    let mut circle = vec![start.to_owned()];
    let mut node = start;
    while let Some(&previous) = came_from.get(node) {
        circle.push(previous.to_owned());
        if previous == start {
            break;
        }
        node = previous;
    }
    circle.reverse();
    circle
}

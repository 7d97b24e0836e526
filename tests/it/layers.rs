//! The crate's files depend on each other one way: no circle among them,
//! submodules included, and the store below everything that serves
//! requests. Read from the sources with a Rust parser (`syn`), every path
//! that names a module (`use` trees and paths in code, `crate::`, `super::`
//! and `self::`, inside inline modules too, but for `#[cfg(test)]` ones), so
//! that a new import that breaks the layering fails here rather than in a
//! reader's head.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module of the crate as the path of its names (`["store", "codes"]`).
type Module = Vec<String>;

/// Every module that has a file of its own, with that file.
fn module_files() -> BTreeMap<Module, PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|extension| extension != "rs") {
            continue;
        }
        let relative = path.strip_prefix(&src).unwrap().with_extension("");
        let mut module: Module = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        if module.last().is_some_and(|name| name == "mod") {
            module.pop();
        }
        if module == ["lib"] || module == ["main"] {
            continue;
        }
        files.insert(module, path);
    }
    files
}

/// Collects the modules a file's paths name, resolved from the module each
/// path stands in (inline modules included).
struct Names<'a> {
    modules: &'a BTreeMap<Module, PathBuf>,
    /// The module the visitor stands in now.
    here: Module,
    named: BTreeSet<Module>,
}

impl Names<'_> {
    /// The module a path of `segments` (from `crate`, `super` or `self`)
    /// names: the longest prefix of it that is a module with a file.
    fn note(&mut self, segments: &[String]) {
        let mut module = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("self" | "super") => self.here.clone(),
            // A child module named bare, as its parent names it (`use batch::Batches`).
            Some(first) if self.modules.contains_key(&[&self.here[..], &[first.to_owned()]].concat()) => {
                let mut child = self.here.clone();
                child.extend(segments.iter().cloned());
                return self.resolve(child);
            }
            _ => return,
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            module.pop();
            while rest.first().is_some_and(|s| s == "super") {
                module.pop();
                rest = &rest[1..];
            }
        }
        module.extend(rest.iter().cloned());
        self.resolve(module);
    }

    /// Notes the longest prefix of `module` that is a module with a file.
    fn resolve(&mut self, mut module: Module) {
        while !module.is_empty() && !self.modules.contains_key(&module) {
            module.pop();
        }
        if !module.is_empty() {
            self.named.insert(module);
        }
    }

    /// Every path a `use` tree spells, from `prefix`.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.note(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.note(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.note(&prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Unit tests are not the program: they may reach into any module
        // (a parser's tests use the helper that splits requests into pieces).
        let cfg_test = |attribute: &syn::Attribute| {
            attribute.path().is_ident("cfg")
                && attribute.parse_args::<syn::Path>().is_ok_and(|path| path.is_ident("test"))
        };
        if item.attrs.iter().any(cfg_test) {
            return;
        }
        self.here.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.here.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segments);
        syn::visit::visit_path(self, path);
    }
}

/// Each file's module and the modules (with files) it depends on: those
/// its paths name, but for its own ancestors, whose items a module may use
/// (a parent is its children's context), and itself.
fn dependencies() -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = module_files();
    let mut graph = BTreeMap::new();
    for (module, path) in &modules {
        let file = syn::parse_file(&std::fs::read_to_string(path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut names = Names { modules: &modules, here: module.clone(), named: BTreeSet::new() };
        names.visit_file(&file);
        let named = names.named.into_iter().filter(|named| !module.starts_with(named)).collect();
        graph.insert(module.clone(), named);
    }
    graph
}

/// A circle of the graph, as the modules around it, if there is one.
fn circle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    // Depth first; `path` is the chain from the root to where the walk stands.
    fn walk(
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        module: &Module,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            return Some(path[at..].to_vec());
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.clone());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = walk(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|module| walk(graph, module, &mut Vec::new(), &mut done))
}

fn named(text: &str) -> Module {
    text.split("::").map(str::to_owned).collect()
}

#[test]
fn no_file_depends_on_itself_through_others() {
    let graph = dependencies();
    // The parser found what the layering rests on.
    assert!(graph[&named("api::embeddings")].contains(&named("store")), "{graph:?}");
    assert!(graph[&named("store::codes::floors")].contains(&named("store::codes::ratios")), "{graph:?}");
    assert!(graph[&named("store::scan::coded")].contains(&named("store::cpu")), "{graph:?}");
    // A child named bare by its parent (`use batch::Batches` in `api`).
    assert!(graph[&named("api")].contains(&named("api::batch")), "{graph:?}");
    assert_eq!(circle(&graph), None);

    // A planted circle is found: between two top-level modules, and
    // between two files of the store.
    let mut planted = graph.clone();
    planted.get_mut(&named("store")).unwrap().insert(named("api"));
    assert!(circle(&planted).is_some());
    let mut planted = graph.clone();
    planted.get_mut(&named("store::cpu")).unwrap().insert(named("store::codes"));
    let found = circle(&planted).expect("the planted circle");
    assert!(found.contains(&named("store::cpu")) && found.contains(&named("store::codes")), "{found:?}");
}

/// Everything `module` (and the modules inside it) depends on, directly or not.
fn reach(graph: &BTreeMap<Module, BTreeSet<Module>>, module: &Module) -> BTreeSet<Module> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<Module> = graph.keys().filter(|m| m.starts_with(module)).cloned().collect();
    while let Some(next) = stack.pop() {
        for dependency in graph.get(&next).into_iter().flatten() {
            if seen.insert(dependency.clone()) {
                stack.push(dependency.clone());
            }
        }
    }
    seen.retain(|m| !m.starts_with(module));
    seen
}

#[test]
fn the_layers_hold() {
    let graph = dependencies();
    // The store knows nothing of serving: only the limits, and test support.
    let store = reach(&graph, &named("store"));
    let allowed: BTreeSet<Module> = [named("limits"), named("testing")].into();
    assert!(store.is_subset(&allowed), "the store depends on {store:?}");
    // A connection is a socket's bytes and the API's answers; storage is
    // the API's business.
    let connection = &graph[&named("connection")];
    assert!(!connection.iter().any(|m| m.starts_with(&named("db"))), "connection depends on {connection:?}");
    // The api sits above the store, never below it.
    assert!(reach(&graph, &named("api")).contains(&named("store")));
    // A metric's file names the kernels and the first pass it uses; the
    // scans and the index use the metrics, never the other way round.
    let metric = reach(&graph, &named("store::metric"));
    assert!(metric.contains(&named("store::kernels::lanes")), "the metrics were read: {metric:?}");
    for above in ["store::scan", "store::index"] {
        assert!(!metric.iter().any(|m| m.starts_with(&named(above))), "store::metric depends on {metric:?}");
    }
}

/// The store is pure: no command-line parsing in it (flags are the
/// config's, which turns them into the store's own types).
#[test]
fn the_store_knows_nothing_of_the_command_line() {
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut files = vec![store.clone(), store.with_extension("rs")];
    let mut read = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
        } else if path.exists() {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("clap"), "{} uses clap", path.display());
            read += 1;
        }
    }
    assert!(read > 10, "the store's files were read ({read})");
}

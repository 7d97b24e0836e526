//! The crate's modules depend on each other one way: no cycle among the
//! top-level modules, and the store below everything that serves requests.
//! Read from the sources, so that a new `use` that breaks the layering
//! fails here rather than in a reader's head.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every top-level module of `src/` and the other top-level modules it names
/// (`crate::<module>`).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        let relative = path.strip_prefix(&src).unwrap();
        let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("crate::{"), "{}: name each module in its own `use crate::...`", relative.display());
        let named = graph.entry(module.clone()).or_default();
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if name != module {
                named.insert(name);
            }
        }
    }
    graph
}

/// Everything `module` depends on, directly or not.
fn reach(graph: &BTreeMap<String, BTreeSet<String>>, module: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![module.to_owned()];
    while let Some(next) = stack.pop() {
        for dependency in graph.get(&next).into_iter().flatten() {
            if seen.insert(dependency.clone()) {
                stack.push(dependency.clone());
            }
        }
    }
    seen
}

#[test]
fn modules_depend_one_way() {
    let graph = dependencies();
    assert!(graph.contains_key("api") && graph.contains_key("store"), "{graph:?}");
    for module in graph.keys() {
        assert!(!reach(&graph, module).contains(module), "{module} depends on itself through {graph:?}");
    }
    // The store knows nothing of serving: only the limits, and test support.
    let store = reach(&graph, "store");
    let allowed: BTreeSet<String> = ["limits", "testing"].map(String::from).into();
    assert!(store.is_subset(&allowed), "store depends on {store:?}");
    // The api sits above the store, never below it.
    assert!(reach(&graph, "api").contains("store") && !store.contains("api"));
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

//! The in-memory state: named indexes of embeddings.
//!
//! Reads go straight to an [`Index`]. Every change goes through
//! [`Store::apply`] as a [`Mutation`] that has already been validated, so a
//! write-ahead log can record exactly what is applied, in the order applied.
//! This module knows nothing of HTTP, JSON or sockets.

pub mod aligned;
pub mod codes;
pub mod cpu;
pub mod filter;
pub mod index;
pub mod kernels;
pub mod metric;
pub mod scan;
pub mod screen;
pub mod topk;

use std::collections::BTreeMap;

pub use filter::Filter;
pub use index::{Index, Metric, MetricError, Power, VectorError};
pub use scan::{FirstPass, Scanner, View, Work};

/// Decoded embeddings of one request, in flat reusable buffers.
///
/// Item `i` has id `ids[i]`, vector `values[vector_spans[i]]` and metadata
/// text `metadata[metadata_spans[i]]` (a JSON object, empty for `{}`).
#[derive(Default, Debug, PartialEq)]
pub struct Batch {
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
    pub vector_spans: Vec<(u32, u32)>,
    pub metadata: Vec<u8>,
    pub metadata_spans: Vec<(u32, u32)>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.ids.clear();
        self.values.clear();
        self.vector_spans.clear();
        self.metadata.clear();
        self.metadata_spans.clear();
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn vector(&self, item: usize) -> &[f32] {
        let (start, len) = self.vector_spans[item];
        &self.values[start as usize..(start + len) as usize]
    }

    pub fn metadata(&self, item: usize) -> &[u8] {
        let (start, len) = self.metadata_spans[item];
        &self.metadata[start as usize..(start + len) as usize]
    }
}

/// A validated change to the store.
#[derive(Clone, Copy, Debug)]
pub enum Mutation<'a> {
    CreateIndex {
        name: &'a str,
        dims: usize,
        metric: Metric,
    },
    DropIndex {
        name: &'a str,
    },
    /// Stores the listed items of `batch` (each already checked against the index).
    Upsert {
        index: &'a str,
        batch: &'a Batch,
        items: &'a [u32],
    },
    /// Removes the given ids (each known to exist).
    Delete {
        index: &'a str,
        ids: &'a [i64],
    },
}

/// All indexes, by name; a `BTreeMap` so listing is sorted without work.
#[derive(Default)]
pub struct Store {
    indexes: BTreeMap<String, Index>,
}

/// While it lives, a child forked from the process gets of the indexes'
/// large arrays only the rows a snapshot writes (`Store::rows_for_forks`):
/// the page tables of the rest are not copied, which is most of a fork's
/// stall, and the loop's writes to them fault no copies while the child
/// runs. A child must read nothing else of them: those pages are not in
/// its address space. Dropped, it gives every array back to later forks.
#[must_use = "forks see the arrays again only when it is dropped"]
pub struct ForkRows<'a> {
    store: &'a Store,
}

impl Drop for ForkRows<'_> {
    fn drop(&mut self) {
        for index in self.store.indexes.values() {
            index.inherit(true, true);
        }
    }
}

impl Store {
    pub fn new() -> Store {
        Store::default()
    }

    /// Leaves every index's codes, and the rows of all but `only` (of all
    /// when `None`), out of children forked while the guard lives.
    pub fn rows_for_forks(&self, only: Option<&str>) -> ForkRows<'_> {
        for (name, index) in &self.indexes {
            index.inherit(only.is_none_or(|only| only == name), false);
        }
        ForkRows { store: self }
    }

    pub fn index(&self, name: &str) -> Option<&Index> {
        self.indexes.get(name)
    }

    /// How many indexes there are.
    pub fn len(&self) -> usize {
        self.indexes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indexes.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.indexes.keys().map(String::as_str)
    }

    pub fn indexes(&self) -> impl Iterator<Item = (&str, &Index)> {
        self.indexes.iter().map(|(name, index)| (name.as_str(), index))
    }

    pub fn index_mut(&mut self, name: &str) -> Option<&mut Index> {
        self.indexes.get_mut(name)
    }

    /// Removes an index whole, handing it to the caller (who may put it back).
    pub fn take_index(&mut self, name: &str) -> Option<Index> {
        self.indexes.remove(name)
    }

    /// Puts an index in place under `name`, returning any it replaced.
    pub fn put_index(&mut self, name: &str, index: Index) -> Option<Index> {
        self.indexes.insert(name.to_owned(), index)
    }

    /// Applies a validated mutation. Panics if it was not validated: that is
    /// our bug, not the client's.
    pub fn apply(&mut self, mutation: &Mutation<'_>) {
        match *mutation {
            Mutation::CreateIndex { name, dims, metric } => {
                let previous = self.indexes.insert(name.to_owned(), Index::new(dims, metric));
                assert!(previous.is_none(), "create of existing index {name}");
            }
            Mutation::DropIndex { name } => {
                self.indexes.remove(name).expect("drop of missing index");
            }
            Mutation::Upsert { index, batch, items } => {
                let index = self.indexes.get_mut(index).expect("upsert into missing index");
                for &item in items {
                    let item = item as usize;
                    index.upsert(batch.ids[item], batch.vector(item), batch.metadata(item));
                }
            }
            Mutation::Delete { index, ids } => {
                let index = self.indexes.get_mut(index).expect("delete from missing index");
                for &id in ids {
                    let existed = index.delete(id);
                    assert!(existed, "delete of missing id {id}");
                }
            }
        }
    }
}

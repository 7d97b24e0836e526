//! Searches run in groups: those that read the same rows (one index, one
//! filter or none) in one pass over them. Parked lone searches
//! (`batch::Batches`) and the searches of a search-batch both run here.

use std::borrow::BorrowMut;

use super::decode::Include;
use crate::store::topk::{Candidate, TopK};
use crate::store::{Filter, Index, Scanner, Store};

/// What a search asks for besides its query.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ask {
    /// How many nearest rows.
    pub k: usize,
    /// What each hit shows besides its metadata and rank.
    pub include: Include,
    /// What `Index::prepare_query` divided the query by (for `Index::score_of`).
    pub divisor: f64,
}

/// A search to run with the others that read its rows: one parked by a
/// connection, or one of a search-batch. Slots are reused.
#[derive(Default)]
pub struct Slot {
    index: String,
    query: Vec<f32>,
    ask: Ask,
    /// The rows it may find (`None` for every row), by which searches are
    /// grouped: its keys indexed when it was taken, its rows found when
    /// it runs (no change can come between).
    filter: Option<Filter>,
    top: TopK,
    /// Whether it has run, its hits in `top`.
    done: bool,
}

impl Slot {
    /// The query buffer: decode or copy a search's query into it, then `take`.
    pub fn query(&mut self) -> &mut Vec<f32> {
        &mut self.query
    }

    /// Takes the search whose query is in `query()`: what `ask` asks of the
    /// rows of the index `index` that `filter` matches (all if `None`; the
    /// keys it names indexed already).
    pub fn take(&mut self, index: &str, ask: Ask, filter: Option<Filter>) {
        self.index.clear();
        self.index.push_str(index);
        self.ask = ask;
        self.filter = filter;
        self.done = false;
    }

    /// The name of the index it searches.
    pub fn index(&self) -> &str {
        &self.index
    }

    /// Whether it has run.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What it asks for besides its query.
    pub fn ask(&self) -> Ask {
        self.ask
    }

    /// The rows it may find.
    pub fn filter(&self) -> Option<&Filter> {
        self.filter.as_ref()
    }

    /// Its hits, nearest first, once it has run.
    pub fn hits(&mut self) -> &[Candidate] {
        debug_assert!(self.done, "a search's hits are read after it has run");
        self.top.sorted()
    }
}

/// Runs every search of `slots` not yet run: those on the same index with
/// the same filter (or none) together, in one pass over the rows that
/// filter leaves; hands each to `ran` with its index once it has run.
pub fn run_together<S: BorrowMut<Slot>>(
    scanner: &mut Scanner,
    store: &Store,
    slots: &mut [S],
    mut ran: impl FnMut(&mut S, &Index),
) {
    for first in 0..slots.len() {
        let (head, rest) = slots[first..].split_first_mut().expect("the first");
        let search = head.borrow_mut();
        if search.done {
            continue;
        }
        let Some(index) = store.index(&search.index) else {
            unreachable!("a search's index exists until the searches taken before a change are run")
        };
        let mask = search.filter.as_ref().and_then(|filter| index.rows_matching(filter));
        let together = |other: &&mut S| {
            let other: &Slot = (**other).borrow();
            !other.done && other.index == search.index && other.filter == search.filter
        };
        let others = rest.iter_mut().filter(together).map(|other| {
            let other = other.borrow_mut();
            (&other.query[..], other.ask.k, &mut other.top)
        });
        let searches = std::iter::once((&search.query[..], search.ask.k, &mut search.top)).chain(others);
        scanner.search_together(index.view(), mask.as_deref(), searches);
        for other in rest.iter_mut().filter(together) {
            other.borrow_mut().done = true;
            ran(other, index);
        }
        search.done = true;
        ran(head, index);
    }
}

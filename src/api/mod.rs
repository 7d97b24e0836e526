//! The API: routes a parsed request to its endpoint, which decodes the body,
//! reads or changes the store, and writes the envelope.
//!
//! `App::admit` runs when a request's head is in (routing and the API key,
//! before any body byte is looked at); `App::handle` runs when its body is in.
//! All scratch buffers live here and are reused: the loop is single-threaded,
//! so one set serves every connection.

pub mod decode;
pub mod embeddings;
pub mod envelope;
pub mod error;
pub mod health;
pub mod indexes;
pub mod json;

use std::ops::Range;
use std::time::{Duration, Instant};

use ahash::AHashSet;

use crate::auth::{self, KeyCheck};
use crate::db::{Database, StorageError};
pub use crate::endpoint::Endpoint;
use crate::http::{response, Head, Method};
use crate::metrics::Metrics;
use crate::store::index::PARALLEL_SCAN_FLOATS_MIN;
use crate::store::topk::TopK;
use crate::store::{Batch, Store};
pub use error::{ApiError, IndexOp};

/// What `App::handle` did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Its answer is written.
    Answered,
    /// It changed the store: its answer is written but may not leave before `commit`.
    Mutated,
    /// A search, taken into this slot to run with the others of the turn
    /// (`run_parked`) and be answered by `write_parked`.
    Parked(usize),
}

/// Where an endpoint writes its answer, and whether the connection stays open after it.
pub struct Reply<'a> {
    pub out: &'a mut Vec<u8>,
    pub keep_alive: bool,
}

/// A routed request: its endpoint and where the index name sits in the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    pub name: Range<usize>,
}

/// Limits the API enforces on bodies, and what it serves without a key.
#[derive(Clone, Copy, Debug)]
pub struct ApiLimits {
    pub dimensions_max: usize,
    pub k_max: usize,
    pub reply_bytes_max: usize,
    pub body: decode::BodyLimits,
    pub indexes_max: usize,
    pub index_name_bytes_max: usize,
    pub metrics_public: bool,
}

/// The longest the loop waits for more searches to join a batch (`App::gather_window`).
const GATHER_WINDOW_MAX: Duration = Duration::from_millis(2);

/// The OpenAPI document, converted from `openapi.yaml` at build time.
pub const OPENAPI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.json"));

/// Buffers reused by every request.
#[derive(Default)]
pub struct Scratch {
    pub decoder: decode::Decoder,
    pub batch: Batch,
    pub ids: Vec<i64>,
    pub items: Vec<u32>,
    pub skipped: Vec<(u32, embeddings::Skip)>,
    pub seen: AHashSet<i64>,
}

/// A search taken in this turn of the loop, to be run with the others on
/// the same index. Slots are reused from turn to turn.
#[derive(Default)]
struct Parked {
    index: String,
    query: Vec<f32>,
    k: usize,
    keep_alive: bool,
    top: TopK,
    /// The answer, rendered as soon as the search has run: a change later in
    /// the turn may move or alter the rows it names.
    reply: Vec<u8>,
    done: bool,
}

impl Parked {
    /// Renders the answer from the hits in `top` (or the error that they
    /// make too large a reply); the search is then done.
    fn answer(&mut self, index: &crate::store::Index, reply_bytes_max: usize) {
        self.reply.clear();
        let reply = Reply { out: &mut self.reply, keep_alive: self.keep_alive };
        if let Err(error) = embeddings::write_hits(index, &mut self.top, reply_bytes_max, reply) {
            error.write(&mut self.reply, self.keep_alive);
        }
        self.done = true;
    }
}

pub struct App {
    db: Database,
    /// Searches parked this turn: `parked[..parked_len]`.
    parked: Vec<Parked>,
    parked_len: usize,
    /// The last turn that ran searches: how many, and how long they took.
    last_run: (usize, Duration),
    /// How many turns have run searches: the last one's number.
    runs: u64,
    /// Searches parked this turn by clients answered in the last run.
    returned: usize,
    /// Per extra thread a large search may use, a `TopK` per search of a batch.
    partials: Vec<Vec<TopK>>,
    api_key: Vec<u8>,
    limits: ApiLimits,
    scratch: Scratch,
    health: health::Health,
    metrics: Metrics,
}

/// Finds the endpoint for a method and path: 404 for an unknown path, 405
/// (with the allowed method) for a known path asked with another method.
pub fn route(method: Method, path: &str) -> Result<Target, ApiError> {
    let not_found = || ApiError::NotFound { path: path.to_owned() };
    if path == "/metrics" {
        return if method == Method::Get {
            Ok(Target { endpoint: Endpoint::Metrics, name: 0..0 })
        } else {
            Err(ApiError::MethodNotAllowed { path: path.to_owned(), allow: "GET" })
        };
    }
    let rest = path.strip_prefix("/api/v1/").ok_or_else(not_found)?;
    let mut segments = rest.split('/');
    let parts = (segments.next(), segments.next(), segments.next(), segments.next());
    let name_at = |name: &str| {
        let start = name.as_ptr() as usize - path.as_ptr() as usize;
        start..start + name.len()
    };
    let (endpoint, allowed, name) = match parts {
        (Some("health"), None, None, None) => (Endpoint::Health, Method::Get, 0..0),
        (Some("test-auth"), None, None, None) => (Endpoint::TestAuth, Method::Get, 0..0),
        (Some("openapi.json"), None, None, None) => (Endpoint::OpenApi, Method::Get, 0..0),
        (Some("indexes"), Some("list"), None, None) => (Endpoint::ListIndexes, Method::Get, 0..0),
        (Some("indexes"), Some(name), Some(action), None) => {
            let (endpoint, allowed) = match action {
                "create" => (Endpoint::CreateIndex, Method::Put),
                "stats" => (Endpoint::IndexStats, Method::Get),
                "delete" => (Endpoint::DeleteIndex, Method::Delete),
                _ => return Err(not_found()),
            };
            (endpoint, allowed, name_at(name))
        }
        (Some("embeddings"), Some(name), Some(action), None) => {
            let (endpoint, allowed) = match action {
                "search" => (Endpoint::Search, Method::Post),
                "upsert" => (Endpoint::Upsert, Method::Put),
                "insert" => (Endpoint::Insert, Method::Put),
                "retrieve" => (Endpoint::Retrieve, Method::Post),
                "delete" => (Endpoint::DeleteEmbeddings, Method::Delete),
                _ => return Err(not_found()),
            };
            (endpoint, allowed, name_at(name))
        }
        _ => return Err(not_found()),
    };
    if method != allowed {
        let allow = match allowed {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete | Method::Other => "DELETE",
        };
        return Err(ApiError::MethodNotAllowed { path: path.to_owned(), allow });
    }
    Ok(Target { endpoint, name })
}

impl App {
    pub fn new(db: Database, api_key: String, limits: ApiLimits) -> App {
        App {
            db,
            parked: Vec::new(),
            parked_len: 0,
            last_run: (0, Duration::ZERO),
            runs: 0,
            returned: 0,
            partials: (1..search_threads()).map(|_| vec![TopK::new()]).collect(),
            api_key: api_key.into_bytes(),
            limits,
            scratch: Scratch::default(),
            health: health::Health::new(),
            metrics: Metrics::default(),
        }
    }

    /// A read must wait for the next tick while writes of this one are not yet synced.
    pub fn must_wait(&self, target: &Target) -> bool {
        target.endpoint.reads_data() && self.db.has_uncommitted()
    }

    pub fn metrics(&mut self) -> &mut Metrics {
        &mut self.metrics
    }

    /// Takes a complete search to run later in this turn with the others on
    /// its index. If the body or query is bad, answers with the error into
    /// `reply` now and returns `None`.
    fn park_search(&mut self, name: &str, body: &mut [u8], reply: Reply<'_>) -> Option<usize> {
        if self.parked_len == self.parked.len() {
            self.parked.push(Parked::default());
        }
        let slot = &mut self.parked[self.parked_len];
        match embeddings::prepare_search(
            self.db.store(),
            &mut self.scratch.decoder,
            self.limits,
            name,
            body,
            &mut slot.query,
        ) {
            Ok((k, index)) => {
                slot.index.clear();
                slot.index.push_str(name);
                slot.k = k;
                slot.keep_alive = reply.keep_alive;
                slot.done = false;
                self.metrics.add_search_bytes((index.len() * index.dims() * 4) as u64);
                self.parked_len += 1;
                Some(self.parked_len - 1)
            }
            Err(error) => {
                error.write(reply.out, reply.keep_alive);
                None
            }
        }
    }

    /// Runs every parked search not yet run: those on the same index
    /// together, reading its rows once for all of them.
    pub fn run_parked(&mut self) {
        let started = Instant::now();
        let to_run = self.parked[..self.parked_len].iter().filter(|p| !p.done).count();
        if to_run > 0 {
            self.run_parked_now();
            self.last_run = (to_run, started.elapsed());
            self.runs += 1;
        }
    }

    /// The number of the last turn that ran searches: a client answered
    /// in it is expected back (see `search_returned`).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Counts a search just parked by a client answered in the last run.
    pub fn search_returned(&mut self) {
        self.returned += 1;
    }

    /// How long the loop may wait for more searches before running those
    /// parked: while fewer clients answered in the last run have come back
    /// than it answered, and one of the parked searches scans a large
    /// index, those clients are likely about to ask again, and a search
    /// that joins this batch saves a whole pass over the rows. Searches
    /// that missed the last run and waited through it do not count: they
    /// would otherwise stand in for clients still on their way, and every
    /// batch after one that some missed would be as short. A lone client
    /// never waits (it was alone last run too); the wait is at most an
    /// eighth of the last run's scan. Only searches still to run count: a
    /// write runs those parked before it, and the searches after it wait
    /// for its sync, so a turn with a write waits for nothing.
    pub fn gather_window(&self) -> Option<Duration> {
        if self.parked_len == 0 || !self.gathering() {
            return None;
        }
        let store = self.db.store();
        let large = |p: &Parked| {
            !p.done && store.index(&p.index).is_some_and(|i| i.len() * i.dims() >= PARALLEL_SCAN_FLOATS_MIN)
        };
        let took = self.last_run.1;
        self.parked[..self.parked_len].iter().any(large).then(|| (took / 8).min(GATHER_WINDOW_MAX))
    }

    /// Whether fewer clients answered in the last run have searched again than it answered.
    pub fn gathering(&self) -> bool {
        self.returned < self.last_run.0
    }

    fn run_parked_now(&mut self) {
        for first in 0..self.parked_len {
            if self.parked[first].done {
                continue;
            }
            let Some(index) = self.db.store().index(&self.parked[first].index) else {
                unreachable!("a parked search's index exists until the searches parked before a change are run")
            };
            let same_index = |s: &usize| !self.parked[*s].done && self.parked[*s].index == self.parked[first].index;
            if (first + 1..self.parked_len).filter(same_index).count() == 0 {
                // Alone on its index: no batch to build.
                let slot = &mut self.parked[first];
                let top = std::slice::from_mut(&mut slot.top);
                index.search_many(&[&slot.query], &[slot.k], top, &mut self.partials);
                slot.answer(index, self.limits.reply_bytes_max);
                continue;
            }
            let group: Vec<usize> = (first..self.parked_len).filter(same_index).collect();
            self.metrics.add_search_batch(group.len() as u64);
            let mut tops: Vec<TopK> = group.iter().map(|&s| std::mem::take(&mut self.parked[s].top)).collect();
            let queries: Vec<&[f32]> = group.iter().map(|&s| self.parked[s].query.as_slice()).collect();
            let ks: Vec<usize> = group.iter().map(|&s| self.parked[s].k).collect();
            for partial in &mut self.partials {
                partial.resize_with(group.len().max(partial.len()), TopK::new);
            }
            index.search_many(&queries, &ks, &mut tops, &mut self.partials);
            for (&s, top) in group.iter().zip(tops) {
                self.parked[s].top = top;
                self.parked[s].answer(index, self.limits.reply_bytes_max);
            }
        }
    }

    /// Writes the answer of a parked search that has run.
    pub fn write_parked(&mut self, slot: usize, out: &mut Vec<u8>) {
        let parked = &self.parked[slot];
        assert!(parked.done, "a parked search is answered after it has run");
        out.extend_from_slice(&parked.reply);
    }

    /// Forgets this turn's parked searches (their slots are kept for reuse).
    pub fn end_turn(&mut self) {
        self.parked_len = 0;
        self.returned = 0;
    }

    /// Syncs this tick's writes (see `Database::commit`).
    pub fn commit(&mut self) -> Result<(), StorageError> {
        let records = self.db.uncommitted();
        if records == 0 {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let result = self.db.commit();
        self.metrics.observe_sync(records as u64, started.elapsed(), result.is_ok());
        result
    }

    pub fn maintain(&mut self) {
        self.db.maintain();
    }

    pub fn shutdown(&mut self) {
        self.db.shutdown();
    }

    /// Decides on a request from its head alone: where it goes, and whether
    /// its key lets it in. Runs before any byte of the body is read.
    pub fn admit(&self, head: &Head) -> Result<Target, ApiError> {
        let target = route(head.method, &head.path)?;
        let open = match target.endpoint {
            Endpoint::Health | Endpoint::OpenApi => true,
            Endpoint::Metrics => self.limits.metrics_public,
            _ => false,
        };
        if open {
            return Ok(target);
        }
        match auth::check(&self.api_key, &head.api_key) {
            KeyCheck::Ok => Ok(target),
            KeyCheck::Missing => Err(ApiError::NoApiKey),
            KeyCheck::Wrong => Err(ApiError::InvalidApiKey),
        }
    }

    /// Answers an admitted request whose body is complete, or parks it (a
    /// search); says which, and whether it changed the store.
    pub fn handle(&mut self, target: &Target, head: &Head, body: &mut [u8], out: &mut Vec<u8>) -> Handled {
        let name = &head.path[target.name.clone()];
        let keep_alive = head.keep_alive;
        if target.endpoint == Endpoint::Search {
            return match self.park_search(name, body, Reply { out, keep_alive }) {
                Some(slot) => Handled::Parked(slot),
                None => Handled::Answered,
            };
        }
        if target.endpoint.writes() {
            // A change must not be seen by searches that arrived before it.
            self.run_parked();
        }
        let uncommitted_before = self.db.uncommitted();
        let App { db, limits, scratch, health, metrics, .. } = self;
        let result = match target.endpoint {
            Endpoint::Health => {
                health.write(out, keep_alive);
                Ok(())
            }
            Endpoint::TestAuth => {
                envelope::Envelope::start(out, 200, keep_alive, format_args!("Authenticated.")).finish();
                Ok(())
            }
            Endpoint::Metrics => {
                let pending = response::start_typed(out, 200, keep_alive, None, "text/plain; version=0.0.4");
                metrics.render(db.store(), out);
                response::finish(out, pending);
                Ok(())
            }
            Endpoint::OpenApi => {
                let pending = response::start(out, 200, keep_alive, None);
                out.extend_from_slice(OPENAPI_JSON.as_bytes());
                response::finish(out, pending);
                Ok(())
            }
            Endpoint::ListIndexes => {
                indexes::list(db.store(), Reply { out, keep_alive });
                Ok(())
            }
            Endpoint::CreateIndex => indexes::create(db, scratch, *limits, name, body, Reply { out, keep_alive }),
            Endpoint::IndexStats => indexes::stats(db.store(), name, Reply { out, keep_alive }),
            Endpoint::DeleteIndex => indexes::delete(db, name, Reply { out, keep_alive }),
            Endpoint::Search => unreachable!("searches are parked above"),
            Endpoint::Upsert | Endpoint::Insert => {
                let write = if target.endpoint == Endpoint::Upsert {
                    embeddings::Write::Upsert
                } else {
                    embeddings::Write::Insert
                };
                embeddings::write(db, scratch, *limits, write, name, body, Reply { out, keep_alive })
            }
            Endpoint::Retrieve => {
                embeddings::retrieve(db.store(), scratch, *limits, name, body, Reply { out, keep_alive })
            }
            Endpoint::DeleteEmbeddings => {
                embeddings::delete(db, scratch, *limits, name, body, Reply { out, keep_alive })
            }
        };
        if let Err(error) = result {
            error.write(out, keep_alive);
        }
        if self.db.uncommitted() > uncommitted_before {
            Handled::Mutated
        } else {
            Handled::Answered
        }
    }
}

/// Threads a large search may use: the machine's cores, at most 8.
fn search_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(8)
}

/// The index named `name`, or the error its endpoint reports.
fn find<'a>(store: &'a Store, name: &str, op: IndexOp) -> Result<&'a crate::store::Index, ApiError> {
    store.index(name).ok_or_else(|| ApiError::IndexNotFound { name: name.to_owned(), op })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_their_refusals() {
        let target = route(Method::Put, "/api/v1/indexes/abc/create").unwrap();
        assert_eq!(target.endpoint, Endpoint::CreateIndex);
        assert_eq!(&"/api/v1/indexes/abc/create"[target.name], "abc");
        assert_eq!(route(Method::Get, "/api/v1/indexes/list").unwrap().endpoint, Endpoint::ListIndexes);
        for (position, endpoint) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(endpoint as usize, position, "Endpoint::ALL is in declaration order");
        }
        assert_eq!(route(Method::Delete, "/api/v1/embeddings/x/delete").unwrap().endpoint, Endpoint::DeleteEmbeddings);
        assert!(matches!(route(Method::Get, "/api/v1/nope"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/api/v1/health/"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/api/v1/indexes/a/create/x"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/"), Err(ApiError::NotFound { .. })));
        assert_eq!(
            route(Method::Post, "/api/v1/embeddings/x/upsert"),
            Err(ApiError::MethodNotAllowed { path: "/api/v1/embeddings/x/upsert".into(), allow: "PUT" })
        );
    }
}

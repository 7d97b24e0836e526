//! The API: routes a parsed request to its endpoint, which decodes the body,
//! reads or changes the store, and writes the envelope.
//!
//! `App::admit` runs when a request's head is in (routing and the API key,
//! before any body byte is looked at); `App::handle` runs when its body is in.
//! All scratch buffers live here and are reused: the loop is single-threaded,
//! so one set serves every connection.

pub mod batch;
pub mod decode;
pub mod embeddings;
pub mod envelope;
pub mod error;
pub mod group;
pub mod health;
pub mod indexes;
pub mod json;
pub mod replicated;
pub mod route;

use std::time::{Duration, Instant};

use ahash::AHashSet;

use crate::auth::{self, KeyCheck};
use crate::db::Database;
pub use crate::endpoint::Endpoint;
use crate::http::{response, Head};
use crate::metrics::Metrics;
use crate::store::{Batch, Store};
pub use batch::Seat;
use batch::{Batches, Render};
pub use error::{ApiError, IndexOp};
pub use route::{route, Target};

pub use replicated::Gate;

/// What `App::handle` did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Its answer, of this status, is written.
    Answered(u16),
    /// It changed the store: its answer, of this status, is written but may
    /// not leave before `commit`.
    Mutated(u16),
    /// A search, parked on the connection's seat to run with the others of
    /// the turn (`run_parked`) and be answered by `answer_parked`.
    Parked,
    /// A cluster's write, proposed as this number: its answer comes from
    /// `take_answer` once it is applied, or has timed out.
    Replicating(u64),
    /// A snapshot download: its head is written; `stream` sends it with
    /// the body, from a child, on the connection's socket.
    Stream,
}

/// Who asks: the connection's key in the loop, and its read's gate.
pub struct Caller<'a> {
    pub conn: usize,
    pub gate: &'a mut Gate,
    pub seat: &'a mut Seat,
    pub now: Instant,
}

/// Where an endpoint writes its answer, and whether the connection stays open after it.
pub struct Reply<'a> {
    pub out: &'a mut Vec<u8>,
    pub keep_alive: bool,
}

/// Limits the API enforces on bodies, and what it serves without a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    pub dimensions_max: usize,
    pub k_max: usize,
    pub search_batch_max: usize,
    pub reply_bytes_max: usize,
    pub body: decode::BodyLimits,
    pub indexes_max: usize,
    pub index_name_bytes_max: usize,
    pub metrics_public: bool,
}

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
    /// A search batch's queries, one after another, and what each search
    /// asks for (with its place among them); a slot per search to run it.
    pub queries: Vec<f32>,
    pub searches: Vec<decode::Search>,
    pub slots: Vec<group::Slot>,
}

pub struct App {
    db: Database,
    batches: Batches,
    api_key: Vec<u8>,
    /// A second key, for searches and reads only (`--read-only-api-key`).
    read_only_key: Option<Vec<u8>>,
    limits: ApiLimits,
    scratch: Scratch,
    health: health::Health,
    metrics: Metrics,
    /// When to give back what requests with bodies larger than the
    /// buffers keep grew.
    large_requests: crate::memory::Linger,
    /// This node's part in a cluster; none for a single node.
    cluster: Option<replicated::Replicated>,
    /// The index of the download `handle` answered `Handled::Stream`.
    download: Option<String>,
    /// How fast downloads are sent, bytes a second; 0: as fast as taken.
    download_rate: u64,
}

impl App {
    pub fn new(db: Database, api_key: String, limits: ApiLimits) -> App {
        App {
            db,
            batches: Batches::default(),
            api_key: api_key.into_bytes(),
            read_only_key: None,
            limits,
            scratch: Scratch::default(),
            health: health::Health::new(),
            metrics: Metrics::default(),
            large_requests: crate::memory::Linger::default(),
            cluster: None,
            download: None,
            download_rate: crate::limits::SNAPSHOT_DOWNLOAD_BYTES_PER_S_DEFAULT,
        }
    }

    /// Sends snapshot downloads at most `rate` bytes a second (0: as fast
    /// as the client takes them).
    pub fn set_download_rate(&mut self, rate: u64) {
        self.download_rate = rate;
    }

    /// Lets `key` in too, for requests that change nothing (`Endpoint::read_only`).
    pub fn set_read_only_key(&mut self, key: String) {
        self.read_only_key = Some(key.into_bytes());
    }

    /// Makes this node a member of a cluster (see `replicated`): its Raft
    /// log opened after `state` (`Database::open_replicated`'s), its peer
    /// port bound, with peer tokens from `token_base`.
    pub fn join_cluster(
        &mut self,
        settings: &crate::cluster::replica::Settings,
        state: Option<Vec<u8>>,
        registry: &mio::Registry,
        token_base: usize,
        frame_bytes_max: usize,
    ) -> Result<(), crate::cluster::replica::StartError> {
        let cluster =
            replicated::Replicated::open(settings, state, &mut self.db, registry, token_base, frame_bytes_max)?;
        self.cluster = Some(cluster);
        Ok(())
    }

    pub fn cluster(&self) -> Option<&replicated::Replicated> {
        self.cluster.as_ref()
    }

    /// Whether `token` is a peer link's; if so it is noted for the next `cluster_turn`.
    pub fn peer_event(&mut self, token: mio::Token) -> bool {
        match &mut self.cluster {
            Some(cluster) if cluster.owns(token) => {
                cluster.peer_event(token);
                true
            }
            _ => false,
        }
    }

    /// Whether the read whose head is in must wait for the cluster (a
    /// linearizable read, before its read index is applied here).
    pub fn hold_read(&mut self, target: &Target, head: &Head, conn: usize, gate: &mut Gate, now: Instant) -> bool {
        match &mut self.cluster {
            Some(cluster) => cluster.hold_read(target.endpoint, head, conn, gate, now),
            None => false,
        }
    }

    /// The cluster's turn (`Replicated::turn`); returns the connections to
    /// service again. An error is a failed sync of the Raft log: the
    /// server must stop.
    pub fn cluster_turn(&mut self, now: Instant) -> std::io::Result<Vec<usize>> {
        let App { db, scratch, cluster, .. } = self;
        let Some(cluster) = cluster else { return Ok(Vec::new()) };
        cluster.turn(db, scratch, now)?;
        Ok(cluster.take_woken())
    }

    /// The answer to the replicated write `seq`, once ready.
    pub fn take_answer(&mut self, seq: u64) -> Option<replicated::Answer> {
        self.cluster.as_mut()?.take_answer(seq)
    }

    /// Forgets the replicated write `seq`: its connection closed.
    pub fn forget_write(&mut self, seq: u64) {
        if let Some(cluster) = &mut self.cluster {
            cluster.forget(seq);
        }
    }

    /// When the loop must run a turn for the cluster's clock, if it is in one.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.cluster.as_ref().map(replicated::Replicated::next_deadline)
    }

    /// Once large requests stop coming, gives back what they grew: the
    /// scratch buffers, the scanner's query buffers and the log's buffer
    /// of records are dropped (the next request grows what it needs), and
    /// the allocator returns its free pages to the system. Without this,
    /// an ingest leaves its largest body's worth of buffers, and the
    /// heap's free space, resident for good. Called at each sweep, it gives
    /// back at the first sweep with no large request since the one before:
    /// while an ingest goes on, its next body reuses the buffers instead of
    /// faulting in tens of megabytes of fresh pages again.
    pub fn release_memory(&mut self) {
        if self.large_requests.quiet() {
            self.scratch = Scratch::default();
            self.batches.scanner().let_go();
            self.db.let_go();
            crate::memory::give_back();
        }
    }

    /// A read must wait for the next tick while writes of this one are not yet synced.
    pub fn must_wait(&self, target: &Target) -> bool {
        target.endpoint.reads_data() && self.db.has_uncommitted()
    }

    pub fn metrics(&mut self) -> &mut Metrics {
        &mut self.metrics
    }

    /// Parks a complete search on `seat`, to run later in this turn with
    /// the others on its index. If the body or query is bad, answers with
    /// the error into `reply` now and returns its status.
    fn park_search(&mut self, name: &str, body: &mut [u8], seat: &mut Seat, reply: Reply<'_>) -> Option<u16> {
        let started = Instant::now();
        let query = self.batches.next_query();
        let store = self.db.store();
        match embeddings::prepare_search(store, &mut self.scratch.decoder, self.limits, name, body, query) {
            Ok((ask, filter)) => {
                // Its rows are found when it runs: no change comes between.
                if let Some(filter) = &filter {
                    self.db.index_keys(name, filter);
                }
                self.batches.park(seat, name, ask, filter, reply.keep_alive, started);
                None
            }
            Err(error) => Some(error.write(reply.out, reply.keep_alive)),
        }
    }

    /// Runs every parked search not yet run, at the end of a turn (see
    /// `batch`): their answers are written when answered, which must follow
    /// before anything changes.
    pub fn run_parked(&mut self) {
        self.run_parked_to(Render::AtAnswer);
    }

    /// Runs every parked search not yet run, rendering as `render` says.
    fn run_parked_to(&mut self, render: Render) {
        self.batches.run(self.db.store(), &mut self.metrics, (render, self.limits.reply_bytes_max));
    }

    /// Writes the answer of the seat's parked search, which has run;
    /// returns its status and when it was taken, or `None` if the seat has
    /// none.
    pub fn answer_parked(&mut self, seat: &mut Seat, out: &mut Vec<u8>) -> Option<(u16, Instant)> {
        self.batches.answer(seat, (self.db.store(), self.limits.reply_bytes_max), out)
    }

    /// How long the loop may wait for more searches to join this turn's
    /// batch (`Batches::gather_window`).
    pub fn gather_window(&self) -> Option<Duration> {
        self.batches.gather_window(self.db.store())
    }

    /// Whether clients answered in the last run are still expected back.
    pub fn gathering(&self) -> bool {
        self.batches.gathering()
    }

    /// Forgets this turn's parked searches (their slots are kept for reuse).
    pub fn end_turn(&mut self) {
        self.batches.end_turn();
    }

    /// Syncs this tick's writes (see `Database::commit`); a failure is the
    /// error the writes of the tick are answered with instead.
    pub fn commit(&mut self) -> Result<(), ApiError> {
        let records = self.db.uncommitted();
        if records == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.db.commit();
        let elapsed = started.elapsed();
        self.metrics.observe_sync(records as u64, elapsed, result.is_ok());
        if crate::log::enabled(crate::log::Level::Debug) {
            let outcome = if result.is_ok() { "synced" } else { "failed to sync" };
            let (us, s) = (elapsed.as_micros(), if records == 1 { "" } else { "s" });
            crate::log::debug("commit", format_args!("commit: {records} log record{s} {outcome} in {us} µs"));
        }
        result.map_err(ApiError::Storage)
    }

    pub fn maintain(&mut self) {
        self.db.maintain();
    }

    /// The periodic sweep's share: peer links stuck in their handshake.
    pub fn sweep(&mut self, now: Instant) {
        if let Some(cluster) = &mut self.cluster {
            cluster.sweep(now);
        }
    }

    pub fn shutdown(&mut self) {
        self.db.shutdown();
    }

    /// Sends the download `handle` answered `Handled::Stream`: a child
    /// writes `owed` (the replies the connection has not sent, this
    /// answer's head last), then the index's snapshot image, on the socket
    /// `wire` (its socket, and its TLS session if it has one), which the
    /// connection lets go of without shutting it down.
    pub fn stream(&mut self, owed: &[u8], wire: crate::transport::Wire<'_>) -> Result<(), ApiError> {
        let name = self.download.take().expect("a download answered Handled::Stream");
        self.db.stream_index(&name, owed, wire, self.download_rate).map_err(|error| ApiError::SnapshotUnavailable {
            reason: match error {
                crate::db::StreamError::Busy => format!(
                    "{} snapshot downloads are being sent, the most at once; try again later",
                    crate::limits::SNAPSHOT_DOWNLOADS_MAX
                ),
                crate::db::StreamError::Fork(error) => format!("cannot start the download: {error}"),
            },
        })
    }

    /// Decides on a request from its head alone: where it goes, and whether
    /// its key lets it in. Runs before any byte of the body is read.
    pub fn admit(&self, head: &Head) -> Result<Target, ApiError> {
        let target = route(head.method, &head.path)?;
        let open = match target.endpoint {
            Endpoint::Health | Endpoint::OpenApi | Endpoint::Live | Endpoint::Ready => true,
            Endpoint::Metrics => self.limits.metrics_public,
            _ => false,
        };
        if open {
            return Ok(target);
        }
        match auth::check(&self.api_key, &head.api_key) {
            KeyCheck::Ok => return Ok(target),
            KeyCheck::Missing => return Err(ApiError::NoApiKey { header: head.api_key_header }),
            KeyCheck::Wrong => {}
        }
        let read_only = self.read_only_key.as_deref().map(|key| auth::check(key, &head.api_key));
        match read_only {
            Some(KeyCheck::Ok) if target.endpoint.read_only() => Ok(target),
            Some(KeyCheck::Ok) => Err(ApiError::ReadOnlyKey { what: refused_action(target.endpoint) }),
            _ => Err(ApiError::InvalidApiKey { header: head.api_key_header }),
        }
    }

    /// Answers an admitted request whose body is complete, or parks it (a
    /// search); says which, and whether it changed the store.
    pub fn handle(
        &mut self,
        target: &Target,
        head: &Head,
        body: &mut [u8],
        caller: Caller<'_>,
        out: &mut Vec<u8>,
    ) -> Handled {
        let Caller { conn, gate, seat, now } = caller;
        let name = &head.path[target.name.clone()];
        let keep_alive = head.keep_alive;
        if body.len() > crate::limits::BUF_KEEP_BYTES_MAX {
            self.large_requests.used();
        }
        if let Some(cluster) = &mut self.cluster {
            let gate = std::mem::take(gate);
            if target.endpoint.reads_data() {
                if let Err(error) = replicated::consistency(&head.query) {
                    return Handled::Answered(error.write(out, keep_alive));
                }
            }
            if gate == Gate::Expired {
                return Handled::Answered(cluster.read_unavailable().write(out, keep_alive));
            }
            if target.endpoint.changes_members() {
                return match cluster.change_members(target.endpoint, name, body, (conn, keep_alive), now) {
                    Ok(seq) => Handled::Replicating(seq),
                    Err(error) => Handled::Answered(error.write(out, keep_alive)),
                };
            }
            if target.endpoint.writes() {
                let asked = (target.endpoint, self.limits, name);
                return match cluster.propose(asked, (body, &mut self.scratch), (conn, keep_alive), now) {
                    Ok(seq) => Handled::Replicating(seq),
                    Err(error) => Handled::Answered(error.write(out, keep_alive)),
                };
            }
        }
        if target.endpoint == Endpoint::Search {
            return match self.park_search(name, body, seat, Reply { out, keep_alive }) {
                None => Handled::Parked,
                Some(status) => Handled::Answered(status),
            };
        }
        if target.endpoint == Endpoint::IndexSnapshot {
            return match find(self.db.store(), name, IndexOp::Fetch) {
                Ok(index) => {
                    // The connection ends with it: nothing follows a body sent apart.
                    let pending = response::start_typed(out, 200, false, None, "application/octet-stream");
                    response::finish_sent_apart(out, pending, crate::snapshot::image_bytes(index));
                    self.download = Some(name.to_owned());
                    Handled::Stream
                }
                Err(error) => Handled::Answered(error.write(out, keep_alive)),
            };
        }
        if target.endpoint.writes() {
            // A change must not be seen by searches that arrived before it.
            self.run_parked_to(Render::Now);
        }
        let uncommitted_before = self.db.uncommitted();
        let App { db, limits, scratch, health, metrics, batches, .. } = self;
        let result = match target.endpoint {
            Endpoint::Health => Ok(health.write(out, keep_alive)),
            Endpoint::Live => Ok(envelope::Envelope::start(out, 200, keep_alive, format_args!("live")).finish()),
            Endpoint::Ready => match self.cluster.as_ref().map_or(Ok(()), replicated::Replicated::readiness) {
                Ok(()) => Ok(envelope::Envelope::start(out, 200, keep_alive, format_args!("ready")).finish()),
                Err(reason) => Err(ApiError::NotReady { reason }),
            },
            Endpoint::TestAuth => {
                Ok(envelope::Envelope::start(out, 200, keep_alive, format_args!("Authenticated.")).finish())
            }
            Endpoint::Metrics => {
                let pending = response::start_typed(out, 200, keep_alive, None, "text/plain; version=0.0.4");
                metrics.render(db.store(), out);
                Ok(response::finish(out, pending))
            }
            Endpoint::OpenApi => {
                let pending = response::start(out, 200, keep_alive, None);
                out.extend_from_slice(OPENAPI_JSON.as_bytes());
                Ok(response::finish(out, pending))
            }
            Endpoint::Cluster => {
                let status = self.cluster.as_ref().map(|cluster| cluster.replica().status());
                Ok(replicated::write_status(status.as_ref(), Reply { out, keep_alive }))
            }
            Endpoint::AddMember | Endpoint::RemoveMember => Err(ApiError::NotACluster),
            Endpoint::ListIndexes => Ok(indexes::list(db.store(), Reply { out, keep_alive })),
            Endpoint::IndexStats => indexes::stats(db.store(), name, Reply { out, keep_alive }),
            Endpoint::Search => unreachable!("searches are parked above"),
            Endpoint::SearchBatch => {
                embeddings::search_batch(db, scratch, batches.scanner(), *limits, name, body, Reply { out, keep_alive })
            }
            Endpoint::IndexSnapshot => unreachable!("downloads are streamed above"),
            Endpoint::CreateIndex
            | Endpoint::DeleteIndex
            | Endpoint::RestoreIndex
            | Endpoint::Upsert
            | Endpoint::Insert
            | Endpoint::DeleteEmbeddings => {
                replicated::write(target.endpoint, db, scratch, *limits, name, body, Reply { out, keep_alive })
            }
            Endpoint::Scroll => embeddings::scroll(db, scratch, *limits, name, body, Reply { out, keep_alive }),
            Endpoint::Retrieve => {
                embeddings::retrieve(db.store(), scratch, *limits, name, body, Reply { out, keep_alive })
            }
        };
        if target.endpoint == Endpoint::SearchBatch {
            self.metrics.add_search_work(self.batches.scanner().take_work());
        }
        let status = result.unwrap_or_else(|error| error.write(out, keep_alive));
        if self.db.uncommitted() > uncommitted_before {
            Handled::Mutated(status)
        } else {
            Handled::Answered(status)
        }
    }
}

/// What a request the read-only key may not make would have done, for its error.
fn refused_action(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::CreateIndex => "create an index",
        Endpoint::DeleteIndex => "delete an index",
        Endpoint::Upsert => "upsert embeddings",
        Endpoint::Insert => "insert embeddings",
        Endpoint::DeleteEmbeddings => "delete embeddings",
        Endpoint::RestoreIndex => "restore an index",
        Endpoint::AddMember => "add a member to the cluster",
        Endpoint::RemoveMember => "remove a member from the cluster",
        _ => "make this request",
    }
}

/// The index named `name`, or the error its endpoint reports.
fn find<'a>(store: &'a Store, name: &str, op: IndexOp) -> Result<&'a crate::store::Index, ApiError> {
    store.index(name).ok_or_else(|| ApiError::IndexNotFound { name: name.to_owned(), op })
}

//! The API of a cluster's node: writes go through the Raft log, reads wait
//! for a read index. Without the cluster flags nothing here runs.
//!
//! **Writes.** The node a client asks puts the request in a command (its
//! endpoint, index name and body as the client sent them, the limits this
//! node answers by, and who asked: this node's id and a number of its own)
//! and proposes it; a follower's proposal goes to the leader. Every node
//! applies the committed commands in log order with the same code a single
//! node answers with (`write`), so each reaches the same state, and the
//! asking node's answer is the one a single node would give at that point
//! of the order. Only then, the command being on a majority's disk and
//! applied here, does the asking node answer. A command not applied within
//! the cluster's timeout is answered 503 `CLUSTER_UNAVAILABLE`: it may still
//! be committed later, as the answer says.
//!
//! The body is decoded when the command is applied, not before: its
//! decoding errors and limits are those of the asking node (carried in the
//! command), the same on every node.
//!
//! **Members.** Adding a node proposes it as a learner, with its address;
//! the leader makes it a voter once it has caught up (`Replica`), and the
//! node asked answers once it sees it vote. Removing one proposes its
//! removal (a leader hands its place over first), answered once applied.
//! Both are asked again every second until seen applied: a leader takes
//! one change at a time, and drops another proposed meanwhile.
//!
//! **Reads.** A read (search, retrieve, scroll, stats, list) waits on its
//! connection, unread, for a read index asked after it arrived (one for all
//! the reads of a turn: their round) to be applied here; then it is
//! answered from this node's copy like any read. `?consistency=local`
//! skips the wait.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ahash::AHashMap;
use mio::{Registry, Token};

use super::embeddings::Write;
use super::envelope::Envelope;
use super::{embeddings, indexes, json, ApiError, ApiLimits, Reply, Scratch};
use crate::cluster::replica::{Checkpoint, Machine, Replica, Settings, StartError, Status};
use crate::db::Database;
use crate::endpoint::Endpoint;
use crate::http::Head;
use crate::log as oplog;
use crate::store::Batch;

/// The first byte of every command: its encoding.
const COMMAND_VERSION: u8 = 1;

/// A write as the log carries it:
///
/// ```text
/// version:u8 (1) origin:u64 run:u64 seq:u64 endpoint:u8 limits:u64*11 name_len:u16 name body
/// origin: the asking node's id; run: random, new each time it starts (its
///         numbers start again at 1, and commands of its last run may still
///         be applied after it restarts: they must not answer this run's)
/// endpoint: 1 create index, 2 delete index, 3 upsert, 4 insert, 5 delete embeddings,
///           6 upsert and 7 insert of a body decoded by the asking node (`Batch`)
/// limits: dimensions, k, search-batch, reply bytes, items, metadata entries,
///         metadata bytes, filter depth, filter terms, indexes, index name bytes
/// ```
#[derive(Debug, PartialEq)]
struct Command<'a> {
    origin: u64,
    run: u64,
    seq: u64,
    endpoint: Endpoint,
    kind: Body,
    limits: ApiLimits,
    name: &'a str,
    body: &'a [u8],
}

/// The codes of an upsert and an insert whose body is a decoded batch.
const UPSERT_BATCH: u8 = 6;
const INSERT_BATCH: u8 = 7;

/// What a command's body holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// The body as the client sent it.
    AsSent,
    /// An insert's or upsert's items, decoded by the asking node (`encode_batch`).
    Batch,
}

fn endpoint_code(endpoint: Endpoint) -> Option<u8> {
    Some(match endpoint {
        Endpoint::CreateIndex => 1,
        Endpoint::DeleteIndex => 2,
        Endpoint::Upsert => 3,
        Endpoint::Insert => 4,
        Endpoint::DeleteEmbeddings => 5,
        Endpoint::RestoreIndex => 8,
        _ => return None,
    })
}

fn endpoint_of(code: u8) -> Option<(Endpoint, Body)> {
    Some(match code {
        1 => (Endpoint::CreateIndex, Body::AsSent),
        2 => (Endpoint::DeleteIndex, Body::AsSent),
        3 => (Endpoint::Upsert, Body::AsSent),
        4 => (Endpoint::Insert, Body::AsSent),
        5 => (Endpoint::DeleteEmbeddings, Body::AsSent),
        8 => (Endpoint::RestoreIndex, Body::AsSent),
        UPSERT_BATCH => (Endpoint::Upsert, Body::Batch),
        INSERT_BATCH => (Endpoint::Insert, Body::Batch),
        _ => return None,
    })
}

/// An insert's or upsert's decoded items, as a command carries them: each
/// one decoded once, by the node asked, and copied by the others.
///
/// ```text
/// count:u32 { id:i64 values:u32 metadata_len:u32 metadata }*count  f32*(all values)
/// ```
fn encode_batch(batch: &Batch, out: &mut Vec<u8>) {
    let as_u32 = |n: usize| u32::try_from(n).expect("a body under 4 GiB").to_le_bytes();
    out.extend_from_slice(&as_u32(batch.len()));
    for item in 0..batch.len() {
        let metadata = batch.metadata(item);
        out.extend_from_slice(&batch.ids[item].to_le_bytes());
        out.extend_from_slice(&as_u32(batch.vector(item).len()));
        out.extend_from_slice(&as_u32(metadata.len()));
        out.extend_from_slice(metadata);
    }
    for item in 0..batch.len() {
        out.extend_from_slice(bytemuck::cast_slice(batch.vector(item)));
    }
}

/// `encode_batch`'s bytes back into `batch`; false if they are not whole.
fn decode_batch(mut bytes: &[u8], batch: &mut Batch) -> bool {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = bytes.split_at_checked(n)?;
        *bytes = rest;
        Some(head)
    }
    fn u32_of(bytes: &mut &[u8]) -> Option<u32> {
        Some(u32::from_le_bytes(take(bytes, 4)?.try_into().ok()?))
    }
    let mut read = || -> Option<()> {
        batch.clear();
        let count = u32_of(&mut bytes)?;
        let mut start = 0u32;
        for _ in 0..count {
            batch.ids.push(i64::from_le_bytes(take(&mut bytes, 8)?.try_into().ok()?));
            let values = u32_of(&mut bytes)?;
            let metadata_len = u32_of(&mut bytes)?;
            let metadata_start = u32::try_from(batch.metadata.len()).ok()?;
            batch.metadata.extend_from_slice(take(&mut bytes, metadata_len as usize)?);
            batch.vector_spans.push((start, values));
            batch.metadata_spans.push((metadata_start, metadata_len));
            start = start.checked_add(values)?;
        }
        let values = take(&mut bytes, start as usize * 4)?;
        batch.values.extend(values.chunks_exact(4).map(|v| f32::from_le_bytes(v.try_into().expect("4 bytes"))));
        bytes.is_empty().then_some(())
    };
    read().is_some()
}

fn limits_as_numbers(limits: &ApiLimits) -> [usize; 11] {
    let body = &limits.body;
    [
        limits.dimensions_max,
        limits.k_max,
        limits.search_batch_max,
        limits.reply_bytes_max,
        body.items_max,
        body.metadata_entries_max,
        body.metadata_bytes_max,
        body.filter_depth_max,
        body.filter_terms_max,
        limits.indexes_max,
        limits.index_name_bytes_max,
    ]
}

fn limits_from_numbers(n: [usize; 11]) -> ApiLimits {
    ApiLimits {
        dimensions_max: n[0],
        k_max: n[1],
        search_batch_max: n[2],
        reply_bytes_max: n[3],
        body: super::decode::BodyLimits {
            items_max: n[4],
            metadata_entries_max: n[5],
            metadata_bytes_max: n[6],
            filter_depth_max: n[7],
            filter_terms_max: n[8],
        },
        indexes_max: n[9],
        index_name_bytes_max: n[10],
        metrics_public: false,
    }
}

impl Command<'_> {
    /// Its bytes; none for a name of 64 KiB or more (no index has one).
    fn encode(&self) -> Option<Vec<u8>> {
        let code = match (self.endpoint, self.kind) {
            (Endpoint::Upsert, Body::Batch) => UPSERT_BATCH,
            (Endpoint::Insert, Body::Batch) => INSERT_BATCH,
            (endpoint, _) => endpoint_code(endpoint).expect("a command is a write"),
        };
        let name_len = u16::try_from(self.name.len()).ok()?;
        let name = self.name.as_bytes();
        let mut out = Vec::with_capacity(1 + 24 + 1 + 88 + 2 + name.len() + self.body.len());
        out.push(COMMAND_VERSION);
        out.extend_from_slice(&self.origin.to_le_bytes());
        out.extend_from_slice(&self.run.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.push(code);
        for n in limits_as_numbers(&self.limits) {
            out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        out.extend_from_slice(&name_len.to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(self.body);
        Some(out)
    }

    fn decode(bytes: &[u8]) -> Option<Command<'_>> {
        let (&version, rest) = bytes.split_first()?;
        if version != COMMAND_VERSION {
            return None;
        }
        let (origin, rest) = take_u64(rest)?;
        let (run, rest) = take_u64(rest)?;
        let (seq, rest) = take_u64(rest)?;
        let (&code, mut rest) = rest.split_first()?;
        let (endpoint, kind) = endpoint_of(code)?;
        let mut numbers = [0usize; 11];
        for n in &mut numbers {
            let (value, after) = take_u64(rest)?;
            *n = usize::try_from(value).ok()?;
            rest = after;
        }
        let (name_len, rest) = rest.split_at_checked(2)?;
        let name_len = u16::from_le_bytes(name_len.try_into().ok()?);
        let (name, body) = rest.split_at_checked(usize::from(name_len))?;
        let name = std::str::from_utf8(name).ok()?;
        Some(Command { origin, run, seq, endpoint, kind, limits: limits_from_numbers(numbers), name, body })
    }
}

fn take_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = bytes.split_at_checked(8)?;
    Some((u64::from_le_bytes(head.try_into().ok()?), rest))
}

/// Answers a write of `endpoint`: the one dispatch a single node and every
/// node of a cluster apply writes through.
pub fn write(
    endpoint: Endpoint,
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    match endpoint {
        Endpoint::CreateIndex => indexes::create(db, scratch, limits, name, body, reply),
        Endpoint::DeleteIndex => indexes::delete(db, name, reply),
        Endpoint::Upsert => embeddings::write(db, scratch, limits, Write::Upsert, name, body, reply),
        Endpoint::Insert => embeddings::write(db, scratch, limits, Write::Insert, name, body, reply),
        Endpoint::DeleteEmbeddings => embeddings::delete(db, scratch, limits, name, body, reply),
        Endpoint::RestoreIndex => indexes::restore(db, scratch, limits, name, body, reply),
        _ => unreachable!("{endpoint:?} is not a write"),
    }
}

/// Where a connection's read stands with the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gate {
    /// It has not asked (or is answered).
    #[default]
    Closed,
    /// It waits for its round's read index, asked at `since`.
    Asked { round: u64, since: Instant },
    /// Its round passed: it may be answered.
    Open,
    /// It waited longer than the cluster's timeout: it is answered 503.
    Expired,
}

/// A write of this node's clients, waiting to be applied.
struct Waiting {
    /// The connection that asked; none once it closed (the write may
    /// still be applied, its answer goes nowhere).
    conn: Option<usize>,
    keep_alive: bool,
    since: Instant,
    /// The command, until a leader has taken it.
    unproposed: Option<Vec<u8>>,
    /// The leader that took it: if another leads before it is applied, it
    /// was probably lost with that leader's term, and the client is told
    /// at once rather than at the timeout.
    leader: Option<u64>,
}

/// A change of members a client of this node asked for.
#[derive(Clone, Copy, Debug)]
enum Change {
    Add { id: u64, address: SocketAddr },
    Remove { id: u64 },
}

/// A change of members waiting to be seen applied.
struct MemberWait {
    conn: Option<usize>,
    keep_alive: bool,
    since: Instant,
    change: Change,
    /// When it was last proposed.
    proposed: Option<Instant>,
}

/// How long a change of members may take: a node added catches up first,
/// which for a large database takes longer than a write may.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a change of members goes unseen before it is proposed again.
const MEMBER_REPROPOSE: Duration = Duration::from_secs(1);

/// A write's answer, ready for its connection.
pub struct Answer {
    pub status: u16,
    pub bytes: Vec<u8>,
}

pub struct Replicated {
    replica: Replica,
    /// This run's number (`Command::run`), and the next command's.
    run: u64,
    next_seq: u64,
    waiting: AHashMap<u64, Waiting>,
    /// Changes of members waiting, by sequence number (the writes').
    members: AHashMap<u64, MemberWait>,
    /// Answers ready, by sequence number (a connection's key may be taken
    /// by another once it closes; a number is never reused in a run).
    answers: AHashMap<u64, Answer>,
    /// Connections with a read waiting: its round, and when it asked.
    reads: Vec<(usize, u64, Instant)>,
    /// Connections to service again: their write is answered, or their read may go.
    woken: Vec<usize>,
    peer_events: Vec<Token>,
    /// Bodies are decoded in place: each applied command's body as sent is copied here.
    body: Vec<u8>,
    /// Where the answers to other nodes' writes are written, and dropped.
    discard: Vec<u8>,
    /// When a state snapshot may next be started.
    next_snapshot_try: Instant,
}

/// How long after starting a state snapshot the next may start.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(1);

impl Replicated {
    /// Joins the cluster: `state` is the checkpoint kept with the
    /// database's last state snapshot (`Database::open_replicated`); a
    /// group's first member without one keeps the group's first.
    pub fn open(
        settings: &Settings,
        state: Option<Vec<u8>>,
        db: &mut Database,
        registry: &Registry,
        token_base: usize,
        frame_bytes_max: usize,
    ) -> Result<Replicated, StartError> {
        let state_path = db.data_dir().join(crate::snapshot::STATE);
        let io_error = |action, source| StartError::Io { action, path: state_path.clone(), source };
        let checkpoint = match state {
            Some(bytes) => Some(Checkpoint::decode(&bytes).ok_or_else(|| {
                io_error("read", io::Error::new(io::ErrorKind::InvalidData, "not a checkpoint this version knows"))
            })?),
            None => match Replica::first_checkpoint(settings) {
                Some(checkpoint) => {
                    db.begin_state(checkpoint.encode()).map_err(|source| io_error("write", source))?;
                    Some(checkpoint)
                }
                None => None,
            },
        };
        let replica = Replica::open(settings, checkpoint, db.data_dir(), registry, token_base, frame_bytes_max)?;
        let mut run = [0u8; 8];
        getrandom::fill(&mut run).map_err(|e| StartError::Io {
            action: "draw a run number from",
            path: "the operating system's random source".into(),
            source: io::Error::other(e.to_string()),
        })?;
        Ok(Replicated {
            replica,
            run: u64::from_le_bytes(run),
            next_seq: 1,
            waiting: AHashMap::new(),
            members: AHashMap::new(),
            answers: AHashMap::new(),
            reads: Vec::new(),
            woken: Vec::new(),
            peer_events: Vec::new(),
            body: Vec::new(),
            discard: Vec::new(),
            next_snapshot_try: Instant::now(),
        })
    }

    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// See `Replica::readiness`.
    pub fn readiness(&self) -> Result<(), String> {
        self.replica.readiness()
    }

    /// Whether `token` is a peer link's.
    pub fn owns(&self, token: Token) -> bool {
        self.replica.owns(token)
    }

    /// Notes readiness of a peer link, handled in the next `turn`.
    pub fn peer_event(&mut self, token: Token) {
        self.peer_events.push(token);
    }

    /// Proposes a write of connection `conn`; its answer comes back from
    /// `take_answer` once applied, or timed out.
    ///
    /// An insert's or upsert's body is decoded here, once: a body that
    /// does not decode is answered at once (as on a single node, its error
    /// does not depend on the data), and the others apply its items.
    pub fn propose(
        &mut self,
        (endpoint, limits, name): (Endpoint, ApiLimits, &str),
        (body, scratch): (&mut [u8], &mut Scratch),
        (conn, keep_alive): (usize, bool),
        now: Instant,
    ) -> Result<u64, ApiError> {
        let mut kind = Body::AsSent;
        let mut decoded = Vec::new();
        if matches!(endpoint, Endpoint::Upsert | Endpoint::Insert) {
            scratch.decoder.embeddings(body, limits.body, &mut scratch.batch)?;
            encode_batch(&scratch.batch, &mut decoded);
            kind = Body::Batch;
        }
        let body = if kind == Body::Batch { &decoded[..] } else { &body[..] };
        let seq = self.next_seq;
        self.next_seq += 1;
        let (origin, run) = (self.replica.id(), self.run);
        let Some(data) = Command { origin, run, seq, endpoint, kind, limits, name, body }.encode() else {
            // No index has such a name: what a single node answers.
            let name = name.chars().take(64).collect();
            return Err(match endpoint {
                Endpoint::CreateIndex => ApiError::IndexNameInvalid { name, bytes_max: limits.index_name_bytes_max },
                Endpoint::DeleteIndex => ApiError::IndexNotFound { name, op: super::IndexOp::Delete },
                _ => ApiError::IndexNotFound { name, op: super::IndexOp::Fetch },
            });
        };
        let leader = self.replica.leader();
        let unproposed = if self.replica.propose(data.clone()) { None } else { Some(data) };
        self.waiting.insert(seq, Waiting { conn: Some(conn), keep_alive, since: now, unproposed, leader });
        Ok(seq)
    }

    /// Starts a change of members asked by connection `conn`: `body` for an
    /// addition, `id` (from the path) for a removal. Its answer comes back
    /// from `take_answer` once the change is seen applied, or timed out.
    pub fn change_members(
        &mut self,
        endpoint: Endpoint,
        id: &str,
        body: &mut [u8],
        (conn, keep_alive): (usize, bool),
        now: Instant,
    ) -> Result<u64, ApiError> {
        let change = match endpoint {
            Endpoint::AddMember => {
                let (id, address) = decode_member(body)?;
                let known = self.replica.address(id).filter(|_| self.replica.member(id).is_some());
                if let Some(known) = known.filter(|&known| known != address) {
                    return Err(ApiError::MemberExists { id, address: known.to_string() });
                }
                Change::Add { id, address }
            }
            _ => {
                let not_found = || ApiError::MemberNotFound { id: id.chars().take(32).collect() };
                let id: u64 = id.parse().map_err(|_| not_found())?;
                match self.replica.member(id) {
                    None => return Err(not_found()),
                    Some(true) if self.replica.voters() == [id] => return Err(ApiError::LastVoter { id }),
                    Some(_) => Change::Remove { id },
                }
            }
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.members.insert(seq, MemberWait { conn: Some(conn), keep_alive, since: now, change, proposed: None });
        Ok(seq)
    }

    /// Proposes the changes of members not seen applied yet, and answers
    /// those that are, or are late.
    fn serve_member_changes(&mut self, now: Instant) {
        let mut done = Vec::new();
        for (&seq, wait) in &mut self.members {
            let applied = match wait.change {
                Change::Add { id, .. } => self.replica.member(id) == Some(true),
                Change::Remove { id } => self.replica.member(id).is_none(),
            };
            if applied || now.duration_since(wait.since) >= MEMBER_TIMEOUT {
                done.push((seq, applied));
                continue;
            }
            let due = wait.proposed.is_none_or(|at| now.duration_since(at) >= MEMBER_REPROPOSE);
            if !due {
                continue;
            }
            wait.proposed = Some(now);
            match wait.change {
                // A learner already: the leader makes it a voter.
                Change::Add { id, .. } if self.replica.member(id).is_some() => {}
                Change::Add { id, address } => {
                    self.replica.propose_add(id, address);
                }
                Change::Remove { id } => {
                    self.replica.propose_remove(id);
                }
            }
        }
        for (seq, applied) in done {
            let wait = self.members.remove(&seq).expect("listed above");
            let Some(conn) = wait.conn else { continue };
            let mut bytes = Vec::new();
            let status = if applied {
                self.write_member(wait.change, &mut bytes, wait.keep_alive)
            } else {
                self.member_unavailable(wait.change).write(&mut bytes, wait.keep_alive)
            };
            self.answers.insert(seq, Answer { status, bytes });
            self.woken.push(conn);
        }
    }

    /// The answer to a change of members seen applied.
    fn write_member(&self, change: Change, out: &mut Vec<u8>, keep_alive: bool) -> u16 {
        let (id, message) = match change {
            Change::Add { id, .. } => (id, "Member added."),
            Change::Remove { id } => (id, "Member removed."),
        };
        let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("{message}"));
        let out = envelope.data();
        out.extend_from_slice(b"{\"id\":");
        json::write_u64(out, id);
        if let Change::Add { address, .. } = change {
            out.extend_from_slice(b",\"address\":");
            json::write_fmt_str(out, format_args!("{address}"));
            out.extend_from_slice(b",\"voter\":true");
        }
        out.push(b'}');
        envelope.finish()
    }

    /// Why a change of members was not seen applied in time.
    fn member_unavailable(&self, change: Change) -> ApiError {
        let seconds = MEMBER_TIMEOUT.as_secs();
        let reason = match change {
            Change::Add { id, .. } if self.replica.member(id).is_some() => {
                let (matched, commit) = self.replica.progress(id);
                let at = matched
                    .map_or(String::new(), |matched| format!(" (its log matches to entry {matched} of {commit})"));
                format!(
                    "node {id} was added as a learner and has not caught up within {seconds} s{at}; the leader makes \
                     it a voter once it has, and GET /api/v1/cluster shows when"
                )
            }
            Change::Add { id, .. } => format!(
                "node {id} could not be added within {seconds} s ({}); it may or may not be added: the same request \
                 can be sent again",
                self.why()
            ),
            Change::Remove { id } => format!(
                "node {id} could not be removed within {seconds} s ({}); it may or may not be removed: the same \
                 request can be sent again",
                self.why()
            ),
        };
        ApiError::ClusterUnavailable { reason }
    }

    /// Decides whether the read `head` asks for waits for a read index.
    /// Returns true while it must wait (the connection reads nothing more).
    pub fn hold_read(&mut self, endpoint: Endpoint, head: &Head, conn: usize, gate: &mut Gate, now: Instant) -> bool {
        if !endpoint.reads_data() || !matches!(consistency(&head.query), Ok(Consistency::Linearizable)) {
            return false;
        }
        match *gate {
            Gate::Closed => {
                let round = self.replica.ask_read();
                *gate = Gate::Asked { round, since: now };
                self.reads.push((conn, round, now));
                true
            }
            Gate::Asked { round, .. } if self.replica.read_passed(round) => {
                *gate = Gate::Open;
                false
            }
            Gate::Asked { since, .. } if now.duration_since(since) >= self.replica.timeout() => {
                *gate = Gate::Expired;
                false
            }
            Gate::Asked { .. } => true,
            Gate::Open | Gate::Expired => false,
        }
    }

    /// The error a read whose gate expired is answered with.
    pub fn read_unavailable(&self) -> ApiError {
        let timeout_ms = self.replica.timeout().as_millis();
        ApiError::ClusterUnavailable {
            reason: format!(
                "this read could not be confirmed with a majority of the cluster within {timeout_ms} ms ({}); \
                 ?consistency=local answers from this node's copy",
                self.why()
            ),
        }
    }

    fn why(&self) -> String {
        match self.replica.leader() {
            Some(leader) if leader == self.replica.id() => "this node leads, but a majority did not answer".to_owned(),
            Some(leader) => format!("the leader is node {leader}, but it did not answer in time"),
            None => "no leader is known".to_owned(),
        }
    }

    /// One turn of the cluster: peer messages, Raft, applying, answers.
    /// An error is a failed sync of the Raft log: the node must stop.
    pub fn turn(&mut self, db: &mut Database, scratch: &mut Scratch, now: Instant) -> io::Result<()> {
        for token in std::mem::take(&mut self.peer_events) {
            self.replica.on_event(token, now);
        }
        for waiting in self.waiting.values_mut() {
            if let Some(data) = waiting.unproposed.take() {
                waiting.leader = self.replica.leader();
                if !self.replica.propose(data.clone()) {
                    waiting.unproposed = Some(data);
                }
            }
        }
        let Replicated { replica, run, waiting, answers, woken, body, discard, .. } = self;
        let me = (replica.id(), *run);
        let mut machine = Applier { db, scratch, me, waiting, answers, woken, body, discard };
        replica.turn(&mut machine, now)?;
        for data in self.replica.take_dropped() {
            // Never received by the leader: proposed again next turn.
            let Some(command) = Command::decode(&data) else { continue };
            if (command.origin, command.run) != (self.replica.id(), self.run) {
                continue;
            }
            if let Some(waiting) = self.waiting.get_mut(&command.seq) {
                waiting.unproposed = Some(data);
            }
        }
        self.keep_state(db, now)?;
        self.serve_member_changes(now);
        self.expire(now);
        let replica = &self.replica;
        self.reads.retain(|&(conn, round, since)| {
            let done = replica.read_passed(round) || now.duration_since(since) >= replica.timeout();
            if done {
                self.woken.push(conn);
            }
            !done
        });
        Ok(())
    }

    /// Cuts the log after a state snapshot just written, and starts one
    /// once the log has grown enough (at most one a second is tried: a
    /// fork that fails is not retried at every turn).
    fn keep_state(&mut self, db: &mut Database, now: Instant) -> io::Result<()> {
        if let Some(bytes) = db.take_written_state() {
            let checkpoint = Checkpoint::decode(&bytes).expect("a checkpoint this node encoded");
            self.replica.compact(&checkpoint.point)?;
            oplog::info(
                "raft_log_compacted",
                format_args!("the Raft log now starts after entry {}", checkpoint.point.index),
            );
        }
        if self.replica.wants_state_snapshot() && now >= self.next_snapshot_try {
            self.next_snapshot_try = now + SNAPSHOT_RETRY;
            db.start_state_snapshot(self.replica.checkpoint().encode());
        }
        Ok(())
    }

    /// Answers 503 the writes that waited past the timeout, or whose leader
    /// lost its place before they were applied.
    fn expire(&mut self, now: Instant) {
        let (timeout, leader) = (self.replica.timeout(), self.replica.leader());
        let late = |w: &Waiting| now.duration_since(w.since) >= timeout;
        let orphaned = |w: &Waiting| w.unproposed.is_none() && w.leader != leader;
        let expired: Vec<(u64, bool)> =
            self.waiting.iter().filter(|(_, w)| late(w) || orphaned(w)).map(|(&seq, w)| (seq, late(w))).collect();
        if expired.is_empty() {
            return;
        }
        let retry = "it may or may not take effect: an upsert or a delete can be retried as it is";
        let timed_out = ApiError::ClusterUnavailable {
            reason: format!(
                "this write could not be committed by a majority of the cluster within {} ms ({}); {retry}",
                timeout.as_millis(),
                self.why()
            ),
        };
        let lost = ApiError::ClusterUnavailable {
            reason: format!(
                "the leader changed before this write was committed ({}); {retry}",
                match leader {
                    Some(leader) => format!("node {leader} leads now"),
                    None => "no leader is known yet".to_owned(),
                }
            ),
        };
        for (seq, late) in expired {
            let error = if late { &timed_out } else { &lost };
            let waiting = self.waiting.remove(&seq).expect("listed above");
            let Some(conn) = waiting.conn else { continue };
            let mut bytes = Vec::new();
            let status = error.write(&mut bytes, waiting.keep_alive);
            self.answers.insert(seq, Answer { status, bytes });
            self.woken.push(conn);
        }
    }

    /// The connections to service again, since the last call.
    pub fn take_woken(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.woken)
    }

    /// The answer of write `seq`, if it is ready.
    pub fn take_answer(&mut self, seq: u64) -> Option<Answer> {
        self.answers.remove(&seq)
    }

    /// Forgets write `seq`, whose connection closed: its answer has nobody
    /// to go to (the write itself may still be applied).
    pub fn forget(&mut self, seq: u64) {
        self.answers.remove(&seq);
        if let Some(wait) = self.members.get_mut(&seq) {
            wait.conn = None;
        }
        if let Some(waiting) = self.waiting.get_mut(&seq) {
            // Kept, unproposed or not, only to be removed when applied or late.
            waiting.conn = None;
        }
    }

    pub fn next_deadline(&self) -> Instant {
        self.replica.next_deadline()
    }

    pub fn sweep(&mut self, now: Instant) {
        self.replica.sweep(now);
    }
}

/// Applies committed commands to the database, and keeps the answers of
/// this node's own.
struct Applier<'a> {
    db: &'a mut Database,
    scratch: &'a mut Scratch,
    /// This node's id and run: the commands it answers.
    me: (u64, u64),
    waiting: &'a mut AHashMap<u64, Waiting>,
    answers: &'a mut AHashMap<u64, Answer>,
    woken: &'a mut Vec<usize>,
    body: &'a mut Vec<u8>,
    discard: &'a mut Vec<u8>,
}

impl Machine for Applier<'_> {
    fn apply(&mut self, index: u64, data: &[u8]) {
        let Some(command) = Command::decode(data) else {
            // Every node skips it alike; only a bug or another version writes one.
            oplog::error(
                "raft_entry_unknown",
                format_args!("Raft entry {index} is not a command this version knows; skipped"),
            );
            return;
        };
        let mine = if (command.origin, command.run) == self.me { self.waiting.remove(&command.seq) } else { None };
        let mut out = match &mine {
            Some(_) => Vec::new(),
            None => std::mem::take(self.discard),
        };
        let keep_alive = mine.as_ref().is_none_or(|waiting| waiting.keep_alive);
        let reply = Reply { out: &mut out, keep_alive };
        let (db, scratch, name) = (&mut *self.db, &mut *self.scratch, command.name);
        let written = match (command.kind, command.endpoint) {
            (Body::Batch, endpoint) if decode_batch(command.body, &mut scratch.batch) => {
                let mode = if endpoint == Endpoint::Insert { Write::Insert } else { Write::Upsert };
                embeddings::write_batch(db, scratch, mode, name, reply)
            }
            (Body::Batch, _) => {
                // Every node refuses it alike; only a bug writes one.
                oplog::error(
                    "raft_entry_undecodable",
                    format_args!("Raft entry {index} holds a batch that does not decode; refused"),
                );
                Err(ApiError::bad_body("the replicated batch did not decode"))
            }
            (Body::AsSent, endpoint) => {
                // Decoded in place: the body is copied out of the entry. A
                // batch is read straight from it.
                self.body.clear();
                self.body.extend_from_slice(command.body);
                write(endpoint, db, scratch, command.limits, name, self.body, reply)
            }
        };
        let status = written.unwrap_or_else(|error| error.write(&mut out, keep_alive));
        match mine.map(|waiting| waiting.conn) {
            Some(None) => {}
            Some(Some(conn)) => {
                self.answers.insert(command.seq, Answer { status, bytes: out });
                self.woken.push(conn);
            }
            None => {
                out.clear();
                *self.discard = out;
            }
        }
    }

    fn restore(&mut self, checkpoint: Vec<u8>, image: &[u8]) -> io::Result<()> {
        self.db.restore_state(checkpoint, image)
    }

    fn stored_state(&mut self) -> io::Result<(Vec<u8>, crate::files::NamedFiles)> {
        self.db.stored_state()
    }
}

/// An addition's body: `{"id": N, "address": "IP:PORT"}`, nothing else.
fn decode_member(body: &mut [u8]) -> Result<(u64, SocketAddr), ApiError> {
    use simd_json::prelude::*;
    let shape = "the body must be {\"id\": N, \"address\": \"IP:PORT\"}";
    let value = simd_json::to_borrowed_value(body).map_err(|_| ApiError::bad_body(format!("not JSON; {shape}")))?;
    let object = value.as_object().ok_or_else(|| ApiError::bad_body(shape))?;
    if let Some(key) = object.keys().find(|key| !matches!(key.as_ref(), "id" | "address")) {
        return Err(ApiError::bad_body(format!(
            "unknown field '{}'; {shape}",
            key.chars().take(64).collect::<String>()
        )));
    }
    let id = object.get("id").ok_or_else(|| ApiError::bad_body(format!("'id' is missing; {shape}")))?;
    let id = id
        .as_u64()
        .filter(|id| (1..=1u64 << 31).contains(id))
        .ok_or_else(|| ApiError::bad_body("'id' must be an integer from 1 to 2147483648"))?;
    let address = object.get("address").ok_or_else(|| ApiError::bad_body(format!("'address' is missing; {shape}")))?;
    let address = address.as_str().ok_or_else(|| ApiError::bad_body("'address' must be a string, IP:PORT"))?;
    // An address, not a name: resolving one would hold the loop up.
    let parsed = address.parse::<SocketAddr>().ok();
    let address = parsed.filter(|address| address.port() != 0 && !address.ip().is_unspecified()).ok_or_else(|| {
        ApiError::bad_body(format!(
            "'address' {:?} is not IP:PORT, the address and port the node listens on for peers (a name is not \
             resolved; 0.0.0.0 and port 0 name no node)",
            address.chars().take(64).collect::<String>()
        ))
    })?;
    Ok((id, address))
}

/// What `?consistency=` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    Linearizable,
    Local,
}

/// The consistency a query string asks for (the default when it names none).
pub fn consistency(query: &str) -> Result<Consistency, ApiError> {
    let mut asked = Consistency::Linearizable;
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix("consistency=") else { continue };
        asked = match value {
            "linearizable" => Consistency::Linearizable,
            "local" => Consistency::Local,
            _ => return Err(ApiError::BadConsistency { value: value.chars().take(64).collect() }),
        };
    }
    Ok(asked)
}

/// Writes `GET /api/v1/cluster`'s answer: `status`, or a single node's.
pub fn write_status(status: Option<&Status>, reply: Reply<'_>) -> u16 {
    let Reply { out, keep_alive } = reply;
    let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("Cluster status retrieved."));
    let out = envelope.data();
    let Some(status) = status else {
        out.extend_from_slice(
            b"{\"node_id\":null,\"role\":\"single\",\"term\":0,\"leader_id\":null,\"commit_index\":0,\
              \"applied_index\":0,\"members\":[]}",
        );
        return envelope.finish();
    };
    let optional = |out: &mut Vec<u8>, n: Option<u64>| match n {
        Some(n) => json::write_u64(out, n),
        None => out.extend_from_slice(b"null"),
    };
    out.extend_from_slice(b"{\"node_id\":");
    json::write_u64(out, status.node_id);
    out.extend_from_slice(b",\"role\":");
    json::write_str(out, status.role);
    out.extend_from_slice(b",\"term\":");
    json::write_u64(out, status.term);
    out.extend_from_slice(b",\"leader_id\":");
    optional(out, status.leader_id);
    out.extend_from_slice(b",\"commit_index\":");
    json::write_u64(out, status.commit_index);
    out.extend_from_slice(b",\"applied_index\":");
    json::write_u64(out, status.applied_index);
    out.extend_from_slice(b",\"members\":[");
    for (n, member) in status.members.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        json::write_u64(out, member.id);
        out.extend_from_slice(b",\"address\":");
        match member.address {
            Some(address) => json::write_fmt_str(out, format_args!("{address}")),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(if member.voter { b",\"voter\":true" } else { b",\"voter\":false" });
        out.extend_from_slice(if member.reachable { b",\"reachable\":true" } else { b",\"reachable\":false" });
        out.extend_from_slice(b",\"match_index\":");
        optional(out, member.match_index);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    envelope.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ApiLimits {
        limits_from_numbers([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    }

    #[test]
    fn a_command_decodes_as_it_was_encoded() {
        let command = Command {
            origin: 3,
            run: 77,
            seq: 1 << 40,
            endpoint: Endpoint::Upsert,
            kind: Body::AsSent,
            limits: limits(),
            name: "docs",
            body: b"{\"embeddings\":[]}",
        };
        let bytes = command.encode().unwrap();
        assert_eq!(Command::decode(&bytes), Some(command));
        // Every cut of it is refused or shorter in body, never misread.
        for cut in 0..bytes.len() {
            if let Some(decoded) = Command::decode(&bytes[..cut]) {
                assert_eq!((decoded.origin, decoded.name), (3, "docs"));
                assert!(decoded.body.len() < b"{\"embeddings\":[]}".len());
            }
        }
        let mut other = bytes.clone();
        other[0] = 2;
        assert_eq!(Command::decode(&other), None);
        other = bytes.clone();
        other[25] = 9;
        assert_eq!(Command::decode(&other), None);
    }

    #[test]
    fn a_batch_decodes_as_it_was_encoded_and_a_cut_one_never() {
        let mut batch = Batch::default();
        let mut decoder = crate::api::decode::Decoder::default();
        let mut body =
            br#"{"embeddings":[{"id":-3,"data":[1.5,2],"metadata":{"a":"b"}},{"id":9,"data":[0.25]}]}"#.to_vec();
        decoder.embeddings(&mut body, crate::api::decode::BodyLimits::DEFAULT, &mut batch).unwrap();
        let mut bytes = Vec::new();
        encode_batch(&batch, &mut bytes);
        let mut back = Batch::default();
        assert!(decode_batch(&bytes, &mut back));
        assert_eq!(
            (&back.ids, back.vector(0), back.metadata(0)),
            (&batch.ids, &[1.5f32, 2.0][..], &br#"{"a":"b"}"#[..])
        );
        assert_eq!((back.vector(1), back.metadata(1)), (&[0.25f32][..], batch.metadata(1)));
        for cut in 0..bytes.len() {
            assert!(!decode_batch(&bytes[..cut], &mut back), "cut at {cut}");
        }
    }

    #[test]
    fn consistency_is_read_from_the_query() {
        assert_eq!(consistency(""), Ok(Consistency::Linearizable));
        assert_eq!(consistency("consistency=local"), Ok(Consistency::Local));
        assert_eq!(consistency("a=b&consistency=linearizable"), Ok(Consistency::Linearizable));
        assert!(matches!(consistency("consistency=eventual"), Err(ApiError::BadConsistency { .. })));
    }
}

//! This node's copy of the database in a cluster: its Raft node, its links
//! to the others, its clock, and the reads waiting for a read index. What
//! the entries mean is the caller's (`StateMachine`): here they are bytes.
//!
//! One turn (`Replica::turn`, once per turn of the server's loop):
//!
//! 1. The messages received since the last turn are stepped.
//! 2. The clock ticks Raft as often as `TICK` has passed.
//! 3. If reads asked for one, a read index is requested: one for every
//!    read of the turn (their round).
//! 4. `Node::advance` persists, applies and sends (its module doc gives
//!    the order: a leader's messages leave before its own sync), until
//!    Raft has nothing ready. A peer that cannot take a message is
//!    reported unreachable (Raft probes it again later).
//! 5. Rounds whose read index is applied pass: their reads may go.
//!
//! Where the state stands and who the members are (`Checkpoint`) is kept
//! with every state snapshot, and sent with the state to a node too far
//! behind; changes of the members after it are log entries, each carrying
//! the addresses of the nodes it adds.
//!
//! **The state sent** is the last state snapshot on disk: Raft is offered
//! its point only, and a snapshot message is sent with the snapshot's
//! files, from the page cache (`Piece`), so the loop never copies the
//! state. Entries after that point stay in the log (it restarts only
//! after a snapshot), so the node sent it catches up from there. A node
//! the snapshot does not name (one added since) would refuse it: Raft's
//! ask then starts a new state snapshot, and the next ask is sent that.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::{Registry, Token};
use protobuf::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, EntryType, Message, MessageType, Snapshot};
use raft::StateRole;

use super::log::{OpenError, Point};
use super::node::{self, Node, Outbox, Timing};
use super::peers::{Peers, Piece};
use crate::files;
use crate::log as oplog;
use crate::wal::frame::Reader;

/// How often Raft's clock ticks.
pub const TICK: Duration = Duration::from_millis(100);

/// Raft's timing in ticks: a follower that hears no leader for 0.8 to 1.6
/// seconds stands for election (so a leader's death costs about two
/// seconds of writes at most, pre-vote and the client's retry included);
/// a leader sends heartbeats five times a second, so that a loaded
/// machine's late turn is not taken for a death.
pub const TIMING: Timing = Timing { election_ticks: 8, heartbeat_ticks: 2 };

// Raft's window of appends to a follower fits half of what a link holds:
// the other half is for heartbeats, answers and a window of entries
// larger than `MESSAGE_BYTES_MAX` each.
const _: () = assert!(
    node::INFLIGHT_MESSAGES_MAX as u64 * node::MESSAGE_BYTES_MAX <= super::peers::OUTGOING_BYTES_MAX as u64 / 2
);

/// What a node of a cluster is started with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub node_id: u64,
    pub peer_addr: SocketAddr,
    /// The first voting members, with their peer addresses (this node's
    /// among them); read only when the data directory holds no cluster state.
    pub initial_peers: Vec<(u64, SocketAddr)>,
    pub secret: String,
    pub timeout: Duration,
    /// A state snapshot is taken once the Raft log has grown this much
    /// since the last (and the log restarts after it).
    pub snapshot_log_bytes: u64,
}

/// What a cluster's node applies its entries to: the database.
pub trait Machine {
    /// Applies the data of the committed entry at `index`.
    fn apply(&mut self, index: u64, data: &[u8]);
    /// Replaces the state with `image` (a leader's, as `stored_state`
    /// gives it), durably, with `checkpoint` kept beside it.
    fn restore(&mut self, checkpoint: Vec<u8>, image: &[u8]) -> io::Result<()>;
    /// The last state snapshot kept: the checkpoint kept beside it, and
    /// its files by name, open: an image is `count:u32 { name_len:u16 name
    /// file_len:u64 file }*count`.
    fn stored_state(&mut self) -> io::Result<(Vec<u8>, files::NamedFiles)>;
}

/// Where a state stands in the Raft log, and the members' addresses then:
/// what a state snapshot keeps beside its data, and what a snapshot sent
/// to a node carries before it.
///
/// ```text
/// version:u8 (1) index:u64 term:u64 voters learners voters_outgoing learners_next auto_leave:u8
///                (each list: count:u32 id:u64*count) count:u32 { id:u64 len:u8 address }*count
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub point: Point,
    pub addresses: BTreeMap<u64, SocketAddr>,
}

const CHECKPOINT_VERSION: u8 = 1;

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![CHECKPOINT_VERSION];
        self.point.encode(&mut out);
        encode_addresses(self.addresses.iter().map(|(&id, &address)| (id, address)), &mut out);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let mut fields = Reader::new(bytes);
        if fields.u8()? != CHECKPOINT_VERSION {
            return None;
        }
        let point = Point::decode(&mut fields)?;
        let addresses = decode_addresses(&mut fields)?.into_iter().collect();
        (fields.left() == 0).then_some(Checkpoint { point, addresses })
    }
}

/// `count:u32 { id:u64 len:u8 address }*count`: the addresses of a
/// checkpoint, or of the nodes a change of members adds (its context).
fn encode_addresses(addresses: impl ExactSizeIterator<Item = (u64, SocketAddr)>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(addresses.len() as u32).to_le_bytes());
    for (id, address) in addresses {
        let text = address.to_string();
        out.extend_from_slice(&id.to_le_bytes());
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
}

fn decode_addresses(fields: &mut Reader<'_>) -> Option<Vec<(u64, SocketAddr)>> {
    let count = fields.u32()?;
    (0..count.min(fields.left()))
        .map(|_| Some((fields.u64()?, fields.name()?.parse().ok()?)))
        .collect::<Option<Vec<_>>>()
        .filter(|addresses| addresses.len() == count)
}

/// A change's context: the addresses of the nodes it adds.
fn change_context(added: &[(u64, SocketAddr)]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_addresses(added.iter().copied(), &mut out);
    out
}

/// A snapshot's data is `checkpoint_len:u32 checkpoint image`.
fn split_snapshot_data(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_at_checked(4)?;
    rest.split_at_checked(u32::from_le_bytes(len.try_into().ok()?) as usize)
}

/// Why the replica could not start.
#[derive(Debug)]
pub enum StartError {
    Log(OpenError),
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The data directory belongs to another node id.
    OtherNode {
        path: PathBuf,
        id: u64,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Log(error) => write!(f, "the Raft log: {error}"),
            StartError::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            StartError::OtherNode { path, id } => write!(
                f,
                "{} says this data directory is node {id}'s; a node keeps its id for life (a node that lost its \
                 data rejoins under a new id)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for StartError {}

/// One member as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub address: Option<SocketAddr>,
    pub voter: bool,
    pub reachable: bool,
    /// How far its log is known to match the leader's (on the leader only).
    pub match_index: Option<u64>,
}

/// What `GET /api/v1/cluster` shows.
#[derive(Clone, Debug)]
pub struct Status {
    pub node_id: u64,
    pub role: &'static str,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub commit_index: u64,
    pub applied_index: u64,
    pub members: Vec<Member>,
}

/// The file naming the node a data directory belongs to, and the peer
/// address of each member: `id=host:port` lines, the node's own first.
const MEMBERS_FILE: &str = "members";

pub struct Replica {
    node: Node,
    peers: Peers,
    /// Every member's peer address, this node's too, as of the last entry applied.
    addresses: BTreeMap<u64, SocketAddr>,
    inbox: Vec<Message>,
    /// Peers a message could not be queued for this turn, and whether it
    /// was a snapshot: reported to Raft after `advance`.
    undelivered: Vec<(u64, bool)>,
    /// The data of proposals that could not be passed to the leader (no
    /// link to it yet, or too much waiting for it): certainly not
    /// received, so the caller may propose them again.
    dropped: Vec<Vec<u8>>,
    next_tick: Instant,
    timeout: Duration,
    snapshot_log_bytes: u64,
    /// Raft asked for a snapshot the one kept cannot be (it does not name
    /// the node behind): a new one is taken.
    state_wanted: bool,
    /// Snapshot messages of this turn, sent once `advance` is done, with
    /// the state's files.
    snapshots: Vec<Message>,
    /// The members a snapshot is on its way to, since when.
    snapshot_sends: BTreeMap<u64, Instant>,
    /// When a leader removed may next try to hand over.
    next_hand_over: Instant,
    /// When a leader may next propose a learner as a voter.
    next_promotion: Instant,
    /// Read rounds: `wanted` if a read of this turn waits for the next
    /// round; each round asked (its number is its read's context) waits in
    /// `asked` for its read index, then in `confirmed` for that index to be
    /// applied; `passed` is the last round whose index is applied.
    next_round: u64,
    wanted: bool,
    asked: BTreeMap<u64, Instant>,
    confirmed: Vec<(u64, u64)>,
    passed: u64,
    /// The term and leader the last round was asked under, and when: a
    /// round can be lost (asked of a leader that lost its place, or of one
    /// new to its term, which drops it; its message dropped on the way),
    /// so while reads wait, one is asked again on a change of leader or
    /// when the last went unanswered for `REASK_AFTER` (a later round
    /// passes the reads of earlier ones).
    asked_under: (u64, Option<u64>),
    last_asked: Instant,
}

/// How far behind the commit index a learner's log may be when it is made
/// a voter: a learner under a steady stream of writes is never exactly there.
const PROMOTE_LAG: u64 = 1000;

/// How long a snapshot sent may go unanswered before it is taken as lost.
const SNAPSHOT_SEND_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a round may go unanswered before another is asked: two
/// heartbeats, long past a quorum's answer on a working cluster.
const REASK_AFTER: Duration = Duration::from_millis(400);

impl Replica {
    /// Opens this node's Raft log in `data_dir/raft`, its state at
    /// `checkpoint` (its last state snapshot's), and listens for peers.
    /// Without a checkpoint, a node given `initial_peers` starts the group
    /// (`first_checkpoint`, kept by the caller first); one without waits to be added.
    pub fn open(
        settings: &Settings,
        checkpoint: Option<Checkpoint>,
        data_dir: &Path,
        registry: &Registry,
        token_base: usize,
        frame_bytes_max: usize,
    ) -> Result<Replica, StartError> {
        let dir = data_dir.join("raft");
        std::fs::create_dir_all(&dir).map_err(|source| StartError::Io {
            action: "create",
            path: dir.clone(),
            source,
        })?;
        let members_path = dir.join(MEMBERS_FILE);
        match read_members(&members_path)? {
            Some(members) if members.first().map(|&(id, _)| id) != Some(settings.node_id) => {
                let id = members.first().map_or(0, |&(id, _)| id);
                return Err(StartError::OtherNode { path: members_path, id });
            }
            Some(_) => {}
            None => write_members(&members_path, &[(settings.node_id, settings.peer_addr)])?,
        }
        let point = checkpoint.as_ref().map(|checkpoint| &checkpoint.point);
        let mut node = Node::open(settings.node_id, &dir, point, TIMING).map_err(StartError::Log)?;
        if let Some(point) = point {
            offer_stored(&mut node, point);
        }
        let secret = settings.secret.as_bytes();
        let peers = Peers::bind(settings.node_id, settings.peer_addr, secret, registry, token_base, frame_bytes_max)
            .map_err(|source| StartError::Io { action: "listen on", path: PathBuf::from("--peer-addr"), source })?;
        let mut replica = Replica {
            node,
            peers,
            addresses: checkpoint.map(|checkpoint| checkpoint.addresses).unwrap_or_default(),
            inbox: Vec::new(),
            undelivered: Vec::new(),
            dropped: Vec::new(),
            next_tick: Instant::now() + TICK,
            timeout: settings.timeout,
            snapshot_log_bytes: settings.snapshot_log_bytes,
            state_wanted: false,
            snapshots: Vec::new(),
            snapshot_sends: BTreeMap::new(),
            next_hand_over: Instant::now(),
            next_promotion: Instant::now(),
            next_round: 1,
            wanted: false,
            asked: BTreeMap::new(),
            confirmed: Vec::new(),
            passed: 0,
            asked_under: (0, None),
            last_asked: Instant::now(),
        };
        // The address the group knows this node by stays (its
        // --peer-addr may be one it binds, 0.0.0.0, that others cannot dial).
        replica.addresses.entry(settings.node_id).or_insert(settings.peer_addr);
        replica.sync_peers();
        Ok(replica)
    }

    /// The checkpoint a group's first member starts from, when it has none:
    /// the first point with `initial_peers` as voters. None for a node that
    /// waits to be added.
    pub fn first_checkpoint(settings: &Settings) -> Option<Checkpoint> {
        if settings.initial_peers.is_empty() {
            return None;
        }
        let voters: Vec<u64> = settings.initial_peers.iter().map(|&(id, _)| id).collect();
        Some(Checkpoint { point: Point::first(&voters), addresses: settings.initial_peers.iter().copied().collect() })
    }

    /// Points the links at the members' addresses, and forgets the others.
    fn sync_peers(&mut self) {
        let me = self.node.id();
        for (&id, &address) in self.addresses.iter().filter(|&(&id, _)| id != me) {
            self.peers.set_address(id, address);
        }
        let gone: Vec<u64> = self.peers.known().filter(|id| !self.addresses.contains_key(id)).collect();
        for id in gone {
            self.peers.forget(id);
        }
    }

    /// Where the state stands now: the applied entry, and the members then.
    pub fn checkpoint(&self) -> Checkpoint {
        let index = self.node.applied_index();
        let term = self.node.term_of(index).expect("the last applied entry is in the log, or its base");
        Checkpoint {
            point: Point { index, term, conf_state: self.node.conf_state() },
            addresses: self.addresses.clone(),
        }
    }

    /// Whether a state snapshot is due: the log has grown enough since its
    /// last restart, or a node behind needs a newer one.
    pub fn wants_state_snapshot(&self) -> bool {
        self.state_wanted || self.node.log().bytes() >= self.snapshot_log_bytes
    }

    /// Restarts the log after `point`, which a state snapshot now covers.
    /// A leader keeps the entries a follower it hears from still reads
    /// (so that it is sent them, not the whole state), up to a snapshot's
    /// worth of log bytes.
    pub fn compact(&mut self, point: &Point) -> io::Result<()> {
        let log = self.node.log();
        let keep_after = match self.node.lowest_active_match() {
            Some(lowest) if self.is_leader() && log.bytes_between(lowest, point.index) <= self.snapshot_log_bytes => {
                lowest.min(point.index)
            }
            _ => point.index,
        };
        self.node.log_mut().restart_keeping(point, keep_after)?;
        offer_stored(&mut self.node, point);
        self.state_wanted = false;
        Ok(())
    }

    pub fn id(&self) -> u64 {
        self.node.id()
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peers.local_addr()
    }

    /// How long a write or read may wait for the cluster.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether `token` is one of the peer links'.
    pub fn owns(&self, token: Token) -> bool {
        self.peers.owns(token)
    }

    /// Handles readiness of a peer token.
    pub fn on_event(&mut self, token: Token, now: Instant) {
        self.peers.on_event(token, now, &mut self.inbox);
    }

    /// When the loop must next run a turn, with nothing else to do.
    pub fn next_deadline(&self) -> Instant {
        self.next_tick
    }

    /// Proposes `data` as an entry; false if no leader can take it now.
    pub fn propose(&mut self, data: Vec<u8>) -> bool {
        self.node.propose(data)
    }

    /// The data of this node's proposals dropped on the way to the leader
    /// since the last call (never received: they may be proposed again).
    pub fn take_dropped(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.dropped)
    }

    /// The round of read index the read asking now waits for.
    pub fn ask_read(&mut self) -> u64 {
        self.wanted = true;
        self.next_round
    }

    /// Whether the reads of `round` may go: its read index is applied.
    pub fn read_passed(&self, round: u64) -> bool {
        round <= self.passed
    }

    /// One turn, in the order of the module doc. An error is a failed sync
    /// of the log: the node must stop (`Node::advance`).
    pub fn turn(&mut self, machine: &mut impl Machine, now: Instant) -> io::Result<()> {
        for message in std::mem::take(&mut self.inbox) {
            let (from, kind) = (message.from, message.get_msg_type());
            if kind == MessageType::MsgPropose && self.is_leader() && removes(&message, self.node.id()) {
                // A leader hands its place over before it is removed: the
                // node that asked proposes again, to the next leader.
                self.hand_over();
                continue;
            }
            if let Err(refused) = self.node.step(message) {
                oplog::debug(
                    "peer_message_refused",
                    format_args!("a {kind:?} from node {from} was refused: {refused}"),
                );
            }
        }
        while now >= self.next_tick {
            self.node.tick();
            self.next_tick += TICK;
            if self.next_tick + TICK < now {
                // The loop was held up (a long request): tick once for it, not for each tick missed.
                self.next_tick = now + TICK;
            }
        }
        let under = (self.node.term(), self.node.leader());
        let stalled = under != self.asked_under || now.duration_since(self.last_asked) >= REASK_AFTER;
        if !self.asked.is_empty() && stalled && under.1.is_some() {
            self.wanted = true;
        }
        if std::mem::take(&mut self.wanted) {
            // The context names the node too: the leader keeps one pending
            // read per context, and every node counts its rounds from 1.
            let mut context = self.node.id().to_le_bytes().to_vec();
            context.extend_from_slice(&self.next_round.to_le_bytes());
            self.node.read_index(context);
            self.asked.insert(self.next_round, now);
            self.asked_under = under;
            self.last_asked = now;
            self.next_round += 1;
        }
        // Rounds never answered (lost to a change of leader) are given up:
        // their reads time out, or a later round passes them.
        let timeout = self.timeout;
        self.asked.retain(|_, &mut at| now.duration_since(at) < timeout);
        loop {
            let mut out = Sender {
                peers: &mut self.peers,
                undelivered: &mut self.undelivered,
                dropped: &mut self.dropped,
                snapshots: &mut self.snapshots,
                now,
            };
            let mut applier = Applier { machine: &mut *machine, addresses: &mut self.addresses, restored: None };
            self.node.advance(&mut applier, &mut out)?;
            let restored = applier.restored.take();
            let mut members_changed = restored.is_some();
            if let Some(point) = restored {
                // What it offers, should it lead, is the state now kept,
                // not the data it was sent (held in memory).
                offer_stored(&mut self.node, &point);
            }
            for message in std::mem::take(&mut self.snapshots) {
                self.send_snapshot(machine, message, now);
            }
            for change in self.node.take_changes() {
                members_changed = true;
                note_change(&change, &mut self.addresses);
            }
            if members_changed {
                self.sync_peers();
            }
            for (to, snapshot) in self.undelivered.drain(..) {
                self.node.unreachable(to);
                if snapshot {
                    self.node.snapshot_sent(to, false);
                }
            }
            for state in self.node.take_read_states() {
                let Ok(bytes) = <[u8; 16]>::try_from(state.request_ctx.as_slice()) else { continue };
                let (node, round) = bytes.split_at(8);
                if node != self.node.id().to_le_bytes() {
                    continue;
                }
                let round = u64::from_le_bytes(round.try_into().expect("8 bytes"));
                if self.asked.remove(&round).is_some() {
                    self.confirmed.push((round, state.index));
                }
            }
            if !self.node.has_ready() {
                break;
            }
        }
        if self.node.log_mut().take_snapshot_wanted() {
            self.state_wanted = true;
        }
        self.settle_snapshots(now);
        self.promote_learners(now);
        self.leave_if_removed(now);
        let applied = self.node.applied_index();
        let passed = &mut self.passed;
        self.confirmed.retain(|&(round, index)| {
            if index <= applied {
                *passed = (*passed).max(round);
            }
            index > applied
        });
        self.peers.flush();
        Ok(())
    }

    /// Sends snapshot `message` with the state kept, from its files; one
    /// that cannot go (the state kept moved on since Raft made it, or a
    /// file cannot be opened) is reported undelivered, and Raft asks again.
    fn send_snapshot(&mut self, machine: &mut impl Machine, message: Message, now: Instant) {
        let metadata = message.get_snapshot().get_metadata();
        let (index, term, to) = (metadata.index, metadata.term, message.to);
        let pieces = machine.stored_state().and_then(|(checkpoint, files)| {
            let point = Checkpoint::decode(&checkpoint).map(|checkpoint| checkpoint.point);
            if point.is_none_or(|point| (point.index, point.term) != (index, term)) {
                return Err(io::Error::other("the state kept has moved on"));
            }
            let mut head = Vec::new();
            head.extend_from_slice(&(checkpoint.len() as u32).to_le_bytes());
            head.extend_from_slice(&checkpoint);
            head.extend_from_slice(&(files.len() as u32).to_le_bytes());
            let mut pieces = vec![Piece::Bytes(head)];
            for (name, file) in files {
                let file = Piece::file(file)?;
                let mut head = Vec::new();
                head.extend_from_slice(&(name.len() as u16).to_le_bytes());
                head.extend_from_slice(name.as_bytes());
                head.extend_from_slice(&file.len().to_le_bytes());
                pieces.extend([Piece::Bytes(head), file]);
            }
            Ok(pieces)
        });
        let sent = match pieces {
            Ok(pieces) => {
                let bytes: u64 = pieces.iter().map(Piece::len).sum();
                let sent = self.peers.send_snapshot(&message, pieces, now).is_ok();
                if sent {
                    oplog::info(
                        "state_sending",
                        format_args!("the state at entry {index} ({bytes} bytes) is being sent to node {to}"),
                    );
                }
                sent
            }
            Err(error) => {
                oplog::info(
                    "state_not_sent",
                    format_args!("the state at entry {index} cannot be sent to node {to} now: {error}"),
                );
                false
            }
        };
        if !sent {
            self.node.unreachable(to);
            self.node.snapshot_sent(to, false);
        }
        self.peers.flush();
    }

    /// Tells Raft a snapshot sent is lost when its link broke before the
    /// node behind answered (it crashed, or refused the frame), or when
    /// it went unanswered for `SNAPSHOT_SEND_TIMEOUT`: Raft sends another
    /// later. (A node that takes it answers, and that ends it too.)
    fn settle_snapshots(&mut self, now: Instant) {
        let targets = self.node.snapshot_targets();
        self.snapshot_sends.retain(|peer, _| targets.contains(peer));
        for peer in targets {
            let sent = *self.snapshot_sends.entry(peer).or_insert(now);
            if !self.peers.reachable(peer) || now.duration_since(sent) >= SNAPSHOT_SEND_TIMEOUT {
                oplog::info("state_lost", format_args!("the snapshot sent to node {peer} was lost; another follows"));
                self.node.snapshot_sent(peer, false);
                self.snapshot_sends.remove(&peer);
            }
        }
    }

    /// A leader its own removal reached (one taken before it led) hands
    /// its place over, once a second until another leads.
    fn leave_if_removed(&mut self, now: Instant) {
        let me = self.node.id();
        if self.is_leader() && self.member(me) != Some(true) && now >= self.next_hand_over {
            self.next_hand_over = now + Duration::from_secs(1);
            self.hand_over();
        }
    }

    /// Whether `id` is a member as of the last entry applied here: a voter
    /// (true) or a learner (false).
    pub fn member(&self, id: u64) -> Option<bool> {
        let conf = self.node.conf_state();
        if conf.voters.contains(&id) {
            Some(true)
        } else if conf.learners.contains(&id) {
            Some(false)
        } else {
            None
        }
    }

    /// The peer address of member `id`, as this node knows it.
    pub fn address(&self, id: u64) -> Option<SocketAddr> {
        self.addresses.get(&id).copied()
    }

    /// The voters as of the last entry applied.
    pub fn voters(&self) -> Vec<u64> {
        self.node.conf_state().voters
    }

    /// How far a member's log matches the leader's, and the commit index,
    /// as this node knows them (the first on the leader only).
    pub fn progress(&self, id: u64) -> (Option<u64>, u64) {
        let matched = if self.is_leader() { self.node.match_index(id) } else { None };
        (matched, self.node.commit_index())
    }

    /// Proposes adding node `id`, listening at `address`, as a learner (the
    /// leader makes it a voter once it has caught up); false if no leader
    /// can take it now.
    pub fn propose_add(&mut self, id: u64, address: SocketAddr) -> bool {
        self.propose_change(ConfChangeType::AddLearnerNode, id, &[(id, address)])
    }

    /// Proposes removing node `id`. A leader asked to remove itself hands
    /// its place over instead (and the caller asks again).
    pub fn propose_remove(&mut self, id: u64) -> bool {
        if id == self.node.id() && self.is_leader() {
            self.hand_over();
            return false;
        }
        self.propose_change(ConfChangeType::RemoveNode, id, &[])
    }

    fn propose_change(&mut self, kind: ConfChangeType, id: u64, added: &[(u64, SocketAddr)]) -> bool {
        let mut single = ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = id;
        let change =
            ConfChangeV2 { changes: vec![single].into(), context: change_context(added).into(), ..Default::default() };
        self.node.propose_change(change)
    }

    /// Hands this leader's place to the voter whose log matches most.
    fn hand_over(&mut self) {
        let me = self.node.id();
        let to = self
            .voters()
            .into_iter()
            .filter(|&id| id != me && self.node.is_active(id))
            .max_by_key(|&id| self.node.match_index(id));
        if let Some(to) = to {
            oplog::info(
                "leadership_handed_over",
                format_args!("node {me} hands its leadership to node {to} before it is removed"),
            );
            self.node.transfer_leader(to);
        }
    }

    /// A leader makes a learner a voter once its log is within
    /// `PROMOTE_LAG` entries of the commit index (one change at a time).
    fn promote_learners(&mut self, now: Instant) {
        if !self.is_leader() || self.node.has_pending_change() || now < self.next_promotion {
            return;
        }
        let commit = self.node.commit_index();
        // Heard from lately too: a learner that caught up and then died
        // would add a voter that never votes.
        let caught_up = self.node.conf_state().learners.into_iter().find(|&id| {
            self.node.is_active(id)
                && self.node.match_index(id).is_some_and(|matched| matched > 0 && matched + PROMOTE_LAG >= commit)
        });
        if let Some(id) = caught_up {
            let address = self.addresses.get(&id).copied();
            let added: Vec<(u64, SocketAddr)> = address.map(|address| (id, address)).into_iter().collect();
            // A proposal a leader drops (it handed over meanwhile) is made again later.
            self.next_promotion = now + Duration::from_millis(500);
            if self.propose_change(ConfChangeType::AddNode, id, &added) {
                oplog::info("learner_caught_up", format_args!("node {id} has caught up: proposed as a voter"));
            }
        }
    }

    /// Closes peer links stuck in their handshake.
    pub fn sweep(&mut self, now: Instant) {
        self.peers.sweep(now);
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        self.node.leader()
    }

    pub fn is_leader(&self) -> bool {
        self.node.role() == StateRole::Leader
    }

    /// Whether this node can serve (`GET /readyz`): a leader is known and
    /// every entry this node knows committed is applied; if not, why.
    pub fn readiness(&self) -> Result<(), String> {
        let (committed, applied) = (self.node.commit_index(), self.node.applied_index());
        if self.node.leader().is_none() {
            Err(format!("node {} knows no leader of the cluster yet", self.node.id()))
        } else if applied < committed {
            Err(format!(
                "node {} has applied the cluster's log up to entry {applied} of {committed} committed",
                self.node.id()
            ))
        } else {
            Ok(())
        }
    }

    pub fn status(&self) -> Status {
        let role = match self.node.role() {
            StateRole::Leader => "leader",
            StateRole::Follower if self.node.is_learner() => "learner",
            StateRole::Follower => "follower",
            StateRole::Candidate | StateRole::PreCandidate => "candidate",
        };
        let conf = self.node.conf_state();
        let leader = self.is_leader();
        let members = conf
            .voters
            .iter()
            .map(|&id| (id, true))
            .chain(conf.learners.iter().map(|&id| (id, false)))
            .map(|(id, voter)| {
                let me = id == self.node.id();
                Member {
                    id,
                    address: self.addresses.get(&id).copied(),
                    voter,
                    reachable: me || self.peers.reachable(id),
                    match_index: if leader { self.node.match_index(id) } else { None },
                }
            })
            .collect();
        Status {
            node_id: self.node.id(),
            role,
            term: self.node.term(),
            leader_id: self.node.leader(),
            commit_index: self.node.commit_index(),
            applied_index: self.node.applied_index(),
            members,
        }
    }
}

/// The state machine Raft's node applies to: the caller's, with the
/// members' addresses kept beside it.
struct Applier<'a, M> {
    machine: &'a mut M,
    addresses: &'a mut BTreeMap<u64, SocketAddr>,
    /// Where a state sent and restored stands.
    restored: Option<Point>,
}

impl<M: Machine> node::StateMachine for Applier<'_, M> {
    fn apply(&mut self, index: u64, data: &[u8]) {
        self.machine.apply(index, data);
    }

    fn restore(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        let metadata = snapshot.get_metadata();
        let damaged = |why: &str| io::Error::other(format!("the snapshot of entry {} sent: {why}", metadata.index));
        let (checkpoint_bytes, image) =
            split_snapshot_data(&snapshot.data).ok_or_else(|| damaged("its data is not whole"))?;
        let checkpoint = Checkpoint::decode(checkpoint_bytes).ok_or_else(|| damaged("its checkpoint is not whole"))?;
        let point = &checkpoint.point;
        if (point.index, point.term, &point.conf_state) != (metadata.index, metadata.term, metadata.get_conf_state()) {
            return Err(damaged("its checkpoint names another entry or other members"));
        }
        let started = Instant::now();
        self.machine.restore(checkpoint_bytes.to_vec(), image)?;
        oplog::info(
            "state_installed",
            format_args!(
                "the state at entry {} ({} bytes) sent by the leader is in place in {} ms",
                metadata.index,
                image.len(),
                started.elapsed().as_millis()
            ),
        );
        self.restored = Some(checkpoint.point.clone());
        *self.addresses = checkpoint.addresses;
        Ok(())
    }
}

/// Whether proposal `message` removes node `id`.
fn removes(message: &Message, id: u64) -> bool {
    message.entries.iter().filter(|entry| entry.get_entry_type() == EntryType::EntryConfChangeV2).any(|entry| {
        ConfChangeV2::parse_from_bytes(&entry.data).is_ok_and(|change| {
            change
                .changes
                .iter()
                .any(|single| single.get_change_type() == ConfChangeType::RemoveNode && single.node_id == id)
        })
    })
}

/// Notes the addresses of the nodes `change` adds, and forgets those it removes.
fn note_change(change: &ConfChangeV2, addresses: &mut BTreeMap<u64, SocketAddr>) {
    let added = decode_addresses(&mut Reader::new(&change.context)).unwrap_or_default();
    for single in &change.changes {
        match single.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                if let Some(&(_, address)) = added.iter().find(|&&(id, _)| id == single.node_id) {
                    addresses.insert(single.node_id, address);
                }
            }
            ConfChangeType::RemoveNode => {
                addresses.remove(&single.node_id);
            }
        }
    }
}

/// Sends `advance`'s messages as soon as it gives them: queued on their
/// links and written to the sockets at once.
struct Sender<'a> {
    peers: &'a mut Peers,
    undelivered: &'a mut Vec<(u64, bool)>,
    dropped: &'a mut Vec<Vec<u8>>,
    /// Snapshot messages, sent by `Replica::send_snapshot` with the state.
    snapshots: &'a mut Vec<Message>,
    now: Instant,
}

impl Outbox for Sender<'_> {
    fn send(&mut self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        for message in messages {
            if message.get_msg_type() == MessageType::MsgSnapshot {
                self.snapshots.push(message);
                continue;
            }
            if self.peers.send(&message, self.now).is_err() {
                self.undelivered.push((message.to, message.get_msg_type() == MessageType::MsgSnapshot));
                if message.get_msg_type() == MessageType::MsgPropose {
                    let normal =
                        message.entries.iter().filter(|entry| entry.get_entry_type() == EntryType::EntryNormal);
                    self.dropped.extend(normal.map(|entry| entry.data.to_vec()));
                }
            }
        }
        self.peers.flush();
    }
}

/// Offers Raft the state kept at `point`: its point only (`send_snapshot`
/// reads the state itself as it sends it).
fn offer_stored(node: &mut Node, point: &Point) {
    let mut snapshot = Snapshot::default();
    let metadata = snapshot.mut_metadata();
    (metadata.index, metadata.term) = (point.index, point.term);
    metadata.set_conf_state(point.conf_state.clone());
    node.log_mut().offer_snapshot(snapshot);
}

fn read_members(path: &Path) -> Result<Option<Vec<(u64, SocketAddr)>>, StartError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StartError::Io { action: "read", path: path.to_owned(), source }),
    };
    let damaged = |line: &str| StartError::Io {
        action: "read",
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("not an id=host:port line: {line:?}")),
    };
    let mut members = Vec::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        let (id, address) = line.split_once('=').ok_or_else(|| damaged(line))?;
        let id = id.parse().map_err(|_| damaged(line))?;
        let address = address.parse().map_err(|_| damaged(line))?;
        members.push((id, address));
    }
    Ok(Some(members))
}

fn write_members(path: &Path, members: &[(u64, SocketAddr)]) -> Result<(), StartError> {
    use std::io::Write as _;
    files::write_atomically(path, |file| {
        for (id, address) in members {
            writeln!(file, "{id}={address}")?;
        }
        Ok(())
    })
    .map_err(|source| StartError::Io { action: "write", path: path.to_owned(), source })
}

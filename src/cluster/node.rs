//! One member of a replication group: `raft`'s `RawNode` over the log on
//! disk, and the order in which a `Ready` is carried out, which is what
//! makes it correct (`Node::advance`):
//!
//! 1. A leader's messages leave at once: Raft lets a leader send entries
//!    before it has them on disk itself, as it counts its own copy only
//!    once it reports them persisted.
//! 2. A snapshot the leader sent replaces the state, and the log restarts
//!    after it.
//! 3. Committed entries are applied, in order. They were on disk before
//!    this `Ready` (committed means persisted here too), so they need not
//!    wait for its sync. A configuration change is applied to Raft; after
//!    a restart it is applied again from the log, after the state's point.
//! 4. This `Ready`'s entries and hard state are appended, and synced: one
//!    `fdatasync` for all of it.
//! 5. Only then leave the messages that promise what was just synced (a
//!    follower's acknowledgements, a vote): `persisted_messages`.
//! 6. `advance` tells Raft all of it is done; what it hands back (a new
//!    commit index, more committed entries, a leader's messages) is
//!    carried out the same way.
//!
//! A node whose sync fails cannot know what reached the disk, and stops
//! (the error goes up): going on could acknowledge what a restart loses.

use std::io;
use std::path::Path;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Message, MessageType, Snapshot,
};
use raft::{Config, RawNode, ReadOnlyOption, ReadState, StateRole, Storage};

use super::log::{LogStore, OpenError, Point, CACHE_BYTES_MAX};

/// What a group's entries are applied to.
pub trait StateMachine {
    /// Applies the data of the committed entry at `index`.
    fn apply(&mut self, index: u64, data: &[u8]);
    /// Replaces the state with a snapshot's, durably, with its point: the
    /// log drops what the snapshot covers as soon as this returns.
    fn restore(&mut self, snapshot: &Snapshot) -> io::Result<()>;
}

/// Where `Node::advance` puts the messages to send, as soon as each may
/// leave: a leader's before its own sync (so that its followers' syncs
/// overlap its own), the rest after.
pub trait Outbox {
    fn send(&mut self, messages: Vec<Message>);
}

/// Messages kept to be sent later (the simulation's network).
impl Outbox for Vec<Message> {
    fn send(&mut self, messages: Vec<Message>) {
        self.extend(messages);
    }
}

/// How often `tick` is called, and what Raft counts in ticks.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Ticks without a leader's word before a follower stands for election
    /// (randomized by Raft between this and twice this).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
}

/// Most bytes of entries in one append message (a message carries one
/// entry at least, whatever its size): a batch of a bulk ingest (3 MB at
/// 1,000 x 768), or many small writes.
pub const MESSAGE_BYTES_MAX: u64 = 4 << 20;

/// Most append messages on their way to one follower: Raft's window of
/// appends, which must fit what a peer link holds (`replica` checks it).
/// A window larger than a link refused its tail; Raft then took the
/// follower for unreachable, probed it and sent again what had gone
/// already, so a follower catching up received about twice the entries it
/// missed.
pub const INFLIGHT_MESSAGES_MAX: usize = 8;

/// Most bytes of committed entries one `Ready` hands over to apply. A
/// restart applies its whole log again, read back from disk: in pieces,
/// each one's buffers freed (and their memory used again) before the next.
const COMMITTED_BYTES_PER_READY_MAX: u64 = 32 << 20;

// The entries a leader sends a follower keeping up, and those a node
// applies next, are read from memory, not from disk.
const _: () =
    assert!(CACHE_BYTES_MAX >= INFLIGHT_MESSAGES_MAX as u64 * MESSAGE_BYTES_MAX + COMMITTED_BYTES_PER_READY_MAX);

/// Why a peer's message was not stepped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Addressed to another node.
    NotForMe,
    /// From node 0, or from this node itself.
    BadSender,
    /// A kind a node only makes for itself.
    LocalKind,
    /// Without the term its kind must carry.
    NoTerm,
    /// A proposal without entries, a read index without exactly one, or
    /// appended entries that do not follow one another or carry no term
    /// (or a term past the message's).
    BadEntries,
    /// An index past this node's log where Raft takes it as within it (a
    /// commit, an acknowledgement, an append without its previous term).
    PastTheLog,
    /// A snapshot without its index or term, or with a configuration Raft
    /// cannot restore.
    BadSnapshot,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::NotForMe => "addressed to another node",
            Refused::BadSender => "from node 0 or from this node",
            Refused::LocalKind => "a kind only a node itself makes",
            Refused::NoTerm => "without a term",
            Refused::BadEntries => "entries out of order or missing",
            Refused::PastTheLog => "an index past this node's log",
            Refused::BadSnapshot => "a snapshot without its index or term, or with an unsound configuration",
        })
    }
}

/// Checks what `raft` takes on trust: it panics on some malformed messages
/// (a vote without a term, a proposal without entries, a read index
/// without its one entry), so none reaches `step` unchecked.
pub fn check_message(message: &Message, me: u64) -> Result<(), Refused> {
    use MessageType::*;
    if message.to != me {
        return Err(Refused::NotForMe);
    }
    if message.from == 0 || message.from == me {
        return Err(Refused::BadSender);
    }
    let kind = message.get_msg_type();
    if matches!(kind, MsgHup | MsgBeat | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum) {
        return Err(Refused::LocalKind);
    }
    let termless = matches!(kind, MsgPropose | MsgReadIndex);
    if message.term == 0 && !termless {
        return Err(Refused::NoTerm);
    }
    let entries = &message.entries;
    match kind {
        MsgPropose if entries.is_empty() => return Err(Refused::BadEntries),
        MsgReadIndex if entries.len() != 1 => return Err(Refused::BadEntries),
        _ => {}
    }
    let follows = |(i, entry): (usize, &Entry)| message.index.checked_add(1 + i as u64) == Some(entry.index);
    // An entry's term is that of the leader that made it: never 0 (Raft
    // would take one past the log as matching anything), never past the
    // message's own.
    let termed = |entry: &Entry| entry.term != 0 && entry.term <= message.term;
    if kind == MsgAppend && !(entries.iter().enumerate().all(follows) && entries.iter().all(termed)) {
        return Err(Refused::BadEntries);
    }
    if kind == MsgSnapshot {
        let metadata = message.get_snapshot().get_metadata();
        if metadata.index == 0 || metadata.term == 0 || !sound(metadata.get_conf_state()) {
            return Err(Refused::BadSnapshot);
        }
    }
    Ok(())
}

/// Whether a configuration is one Raft can restore (it panics on others):
/// some voter, no node 0, none twice, and no voter also a learner.
fn sound(conf: &ConfState) -> bool {
    let voters: Vec<u64> = conf.voters.iter().chain(&conf.voters_outgoing).copied().collect();
    let learners: Vec<u64> = conf.learners.iter().chain(&conf.learners_next).copied().collect();
    let unique = |ids: &[u64]| ids.iter().enumerate().all(|(i, id)| !ids[..i].contains(id));
    !conf.voters.is_empty()
        && !voters.contains(&0)
        && !learners.contains(&0)
        && unique(&conf.voters)
        && unique(&conf.voters_outgoing)
        && unique(&conf.learners)
        && unique(&conf.learners_next)
        && !conf.learners.iter().any(|id| conf.voters.contains(id) || conf.voters_outgoing.contains(id))
        && conf.learners_next.iter().all(|id| conf.voters_outgoing.contains(id))
}

/// Checks what `raft` would take as within this node's log, ending at
/// `last_index`: a commit past it, or an acknowledgement of entries a
/// leader never had, would make it panic; an append after an entry with no
/// term would match any entry. A node that gets one lost what it had
/// acknowledged (a disk replaced under the same id), or a peer is wrong:
/// either way it must not be stepped.
pub fn check_against_log(message: &Message, last_index: u64) -> Result<(), Refused> {
    use MessageType::*;
    let past = match message.get_msg_type() {
        MsgAppend => message.index > 0 && message.log_term == 0,
        MsgHeartbeat => message.commit > last_index,
        MsgAppendResponse => !message.reject && message.index > last_index,
        _ => false,
    };
    if past {
        return Err(Refused::PastTheLog);
    }
    Ok(())
}

/// One member of a replication group.
pub struct Node {
    raw: RawNode<LogStore>,
    /// Read states given by Raft, for the caller to take.
    read_states: Vec<ReadState>,
    /// Changes of the members applied, for the caller to take.
    changes: Vec<ConfChangeV2>,
}

impl Node {
    /// Opens the node `id` with its log in `dir`, the state machine at
    /// `covered` (the point of the state snapshot it was loaded from; a
    /// group's first members start from `Point::first`). A node without
    /// either waits for a leader to add it and send it a snapshot.
    pub fn open(id: u64, dir: &Path, covered: Option<&Point>, timing: Timing) -> Result<Node, OpenError> {
        let store = LogStore::open(dir, covered)?;
        let (state, log) = (covered.map_or(0, |point| point.index), store.first_index().unwrap_or(1) - 1);
        if state < log {
            return Err(OpenError::StateBehindLog { state, log });
        }
        let config = Config {
            id,
            election_tick: timing.election_ticks,
            heartbeat_tick: timing.heartbeat_ticks,
            applied: covered.map_or(0, |point| point.index),
            max_size_per_msg: MESSAGE_BYTES_MAX,
            max_inflight_msgs: INFLIGHT_MESSAGES_MAX,
            max_committed_size_per_ready: COMMITTED_BYTES_PER_READY_MAX,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, store, &logger).map_err(|error| OpenError::Io {
            action: "start Raft on",
            path: dir.to_owned(),
            source: io::Error::other(error),
        })?;
        Ok(Node { raw, read_states: Vec::new(), changes: Vec::new() })
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    pub fn leader(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|&id| id != raft::INVALID_ID)
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn applied_index(&self) -> u64 {
        self.raw.raft.raft_log.applied
    }

    /// Whether this node is a member without a vote.
    pub fn is_learner(&self) -> bool {
        let id = self.id();
        self.raw.raft.prs().conf().learners().contains(&id)
    }

    /// How far `peer`'s log is known to match this leader's.
    pub fn match_index(&self, peer: u64) -> Option<u64> {
        self.raw.raft.prs().get(peer).map(|progress| progress.matched)
    }

    /// Whether Raft has anything for `advance` to carry out.
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Counts one tick of the clock.
    pub fn tick(&mut self) {
        self.raw.tick();
    }

    /// Steps a peer's message, checked first (`check_message`).
    pub fn step(&mut self, message: Message) -> Result<(), Refused> {
        check_message(&message, self.id())?;
        check_against_log(&message, self.raw.raft.raft_log.last_index())?;
        // What Raft refuses of a well-formed message (a response from a
        // node no longer a member) it drops; nothing to do about it.
        let _ = self.raw.step(message);
        Ok(())
    }

    /// Proposes `data` as the next entry; false if no leader can take it
    /// now (none known, or one handing over). A proposal taken may still
    /// be lost to a change of leader: the caller waits for it to be
    /// applied, and gives up after its timeout.
    pub fn propose(&mut self, data: Vec<u8>) -> bool {
        self.raw.propose(Vec::new(), data).is_ok()
    }

    /// Proposes a change of the members; false if no leader can take it
    /// now. A leader takes one at a time: it drops another while one is
    /// not yet applied, so the caller asks again until it sees it applied.
    pub fn propose_change(&mut self, change: ConfChangeV2) -> bool {
        self.raw.propose_conf_change(Vec::new(), change).is_ok()
    }

    /// Whether a change of members this leader took is not applied yet.
    pub fn has_pending_change(&self) -> bool {
        self.raw.raft.pending_conf_index > self.raw.raft.raft_log.applied
    }

    /// Hands this leader's place to `to`, a voter.
    pub fn transfer_leader(&mut self, to: u64) {
        self.raw.transfer_leader(to);
    }

    /// Asks for a read index tagged `context` (unique among the reads
    /// waiting); it comes back from `take_read_states`, or never (no
    /// leader, a leader new to its term, a change of leader).
    pub fn read_index(&mut self, context: Vec<u8>) {
        self.raw.read_index(context);
    }

    /// The changes of the members applied since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<ConfChangeV2> {
        std::mem::take(&mut self.changes)
    }

    /// The lowest index the other members heard from lately still read
    /// on from (on a leader): their match index, or the snapshot on its
    /// way to one (which reads on from there once it has it). A member
    /// behind the log's first entry is left out: the log cannot serve it,
    /// it is sent a state.
    pub fn lowest_active_match(&self) -> Option<u64> {
        let me = self.id();
        let base = self.log().first_index().map_or(0, |first| first - 1);
        let progress = self.raw.raft.prs().iter().filter(|&(&id, pr)| id != me && pr.recent_active);
        progress
            .map(|(_, pr)| if pr.state == raft::ProgressState::Snapshot { pr.pending_snapshot } else { pr.matched })
            .filter(|&at| at >= base)
            .min()
    }

    /// Whether `peer` was heard from lately (on a leader).
    pub fn is_active(&self, peer: u64) -> bool {
        self.raw.raft.prs().get(peer).is_some_and(|pr| pr.recent_active)
    }

    /// The members sent a snapshot, still in flight.
    pub fn snapshot_targets(&self) -> Vec<u64> {
        let progress = self.raw.raft.prs().iter();
        progress.filter(|(_, pr)| pr.state == raft::ProgressState::Snapshot).map(|(&id, _)| id).collect()
    }

    /// The read indexes Raft has given since the last call.
    pub fn take_read_states(&mut self) -> Vec<ReadState> {
        std::mem::take(&mut self.read_states)
    }

    /// Tells Raft that sending to `peer` failed.
    pub fn unreachable(&mut self, peer: u64) {
        self.raw.report_unreachable(peer);
    }

    pub fn log(&self) -> &LogStore {
        self.raw.store()
    }

    /// The log, to offer a snapshot or restart after one.
    pub fn log_mut(&mut self) -> &mut LogStore {
        self.raw.mut_store()
    }

    /// Carries out what Raft has ready, in the order the module doc gives:
    /// applies committed entries to `machine`, makes the log durable, and
    /// puts the messages to send in `out`.
    pub fn advance(&mut self, machine: &mut impl StateMachine, out: &mut impl Outbox) -> io::Result<()> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        out.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            machine.restore(&snapshot)?;
            let metadata = snapshot.get_metadata();
            let point =
                Point { index: metadata.index, term: metadata.term, conf_state: metadata.get_conf_state().clone() };
            let store = self.raw.mut_store();
            store.restart_after(&point)?;
            // Until it takes one of its own, the snapshot it was sent is
            // what it sends a follower behind it, should it lead.
            store.offer_snapshot(snapshot);
        }
        self.apply(machine, ready.take_committed_entries());
        self.read_states.extend(ready.take_read_states());
        let store = self.raw.mut_store();
        store.append(ready.entries());
        if let Some(hard_state) = ready.hs() {
            store.set_hard_state(hard_state);
        }
        store.sync()?;
        out.send(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            let mut hard_state = self.raw.store().hard_state().clone();
            hard_state.commit = commit;
            self.raw.mut_store().set_hard_state(&hard_state);
        }
        out.send(light.take_messages());
        self.apply(machine, light.take_committed_entries());
        self.raw.advance_apply();
        // The commit index and configurations just noted: a restart that
        // lost them would apply the same entries again from the log, so
        // this sync can wait for the next `Ready`'s.
        Ok(())
    }

    /// Applies committed `entries` in order: data to `machine`,
    /// configuration changes to Raft (and the log).
    fn apply(&mut self, machine: &mut impl StateMachine, entries: Vec<Entry>) {
        for entry in entries {
            match entry.get_entry_type() {
                // A new leader's empty entry carries nothing to apply.
                EntryType::EntryNormal if entry.data.is_empty() => {}
                EntryType::EntryNormal => machine.apply(entry.index, &entry.data),
                // A change Raft refuses is refused alike on every node,
                // and changes nothing.
                EntryType::EntryConfChange => {
                    if let Ok(change) = ConfChange::parse_from_bytes(&entry.data) {
                        let _ = self.raw.apply_conf_change(&change);
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    if let Ok(change) = ConfChangeV2::parse_from_bytes(&entry.data) {
                        // Adding a voter again as a learner (a request
                        // proposed again after it was done) would demote it:
                        // every node skips it alike.
                        let voters = self.raw.raft.prs().conf().voters().ids();
                        let demotes = change.changes.iter().any(|single| {
                            single.get_change_type() == ConfChangeType::AddLearnerNode
                                && voters.contains(single.node_id)
                        });
                        if !demotes && self.raw.apply_conf_change(&change).is_ok() {
                            self.changes.push(change);
                        }
                    }
                }
            }
        }
    }

    /// The members as of the last entry applied: what a snapshot taken now
    /// records.
    pub fn conf_state(&self) -> ConfState {
        self.raw.raft.prs().conf().to_conf_state()
    }

    /// The term of the entry at `index`, if the log still holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.raw.raft.raft_log.term(index).ok()
    }

    /// Tells Raft how sending a snapshot to `peer` ended.
    pub fn snapshot_sent(&mut self, peer: u64, delivered: bool) {
        let status = if delivered { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
        self.raw.report_snapshot(peer, status);
    }
}

#[cfg(test)]
mod tests;

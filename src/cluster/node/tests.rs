//! A deterministic simulation of a group of three over a seeded network
//! that loses and delays messages, cuts links and nodes off, and crashes
//! nodes (what a crash had not synced is gone), while clients propose on
//! every node. After it heals, the checkers: every node applied the same
//! entries in the same order, every acknowledged proposal among them once,
//! nothing invented, and an acknowledged proposal before any proposed
//! after its acknowledgement. Everything random comes from the seed, the
//! election timeouts too (`rejitter`), so a failing seed replays exactly.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType, Snapshot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const MEMBERS: [u64; 3] = [1, 2, 3];
const TIMING: Timing = Timing { election_ticks: 10, heartbeat_ticks: 2 };
/// A node takes a snapshot and restarts its log every this many entries.
const SNAPSHOT_EVERY: u64 = 40;

/// The simulated state machine: every entry's data, in the order applied.
#[derive(Default)]
struct Applied {
    /// Where its snapshots are kept.
    dir: PathBuf,
    items: Vec<Vec<u8>>,
    index: u64,
    /// Items applied one by one since the last look (not from a snapshot):
    /// the ones a node may acknowledge.
    fresh: Vec<Vec<u8>>,
    /// Whether a leader's snapshot replaced the state since the last look.
    restored: bool,
}

impl StateMachine for Applied {
    fn apply(&mut self, index: u64, data: &[u8]) {
        assert!(index > self.index, "entry {index} applied after {}", self.index);
        self.index = index;
        self.items.push(data.to_vec());
        self.fresh.push(data.to_vec());
    }

    fn restore(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        save(&self.dir, snapshot)?;
        self.load(snapshot);
        self.restored = true;
        Ok(())
    }
}

impl Applied {
    fn load(&mut self, snapshot: &Snapshot) {
        self.items = decode_items(&snapshot.data);
        self.index = snapshot.get_metadata().index;
        self.fresh.clear();
    }
}

/// Keeps `snapshot` in `dir`: written whole, then renamed into place.
fn save(dir: &Path, snapshot: &Snapshot) -> io::Result<()> {
    let partial = dir.join("state.partial");
    fs::write(&partial, snapshot.write_to_bytes().map_err(io::Error::other)?)?;
    fs::rename(&partial, snapshot_path(dir))
}

fn encode_items(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

fn decode_items(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut items = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        items.push(bytes[4..4 + len].to_vec());
        bytes = &bytes[4 + len..];
    }
    items
}

/// One simulated member: its directory, and, while it runs, its node and
/// state (lost in a crash, read back from its files on restart).
struct Member {
    id: u64,
    dir: PathBuf,
    running: Option<(Node, Applied)>,
    down_until: u64,
    /// The applied index of its last snapshot.
    last_snapshot: u64,
}

/// The state snapshot's file.
fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join("state")
}

impl Member {
    fn start(&mut self, rng: &mut StdRng) {
        if !snapshot_path(&self.dir).exists() {
            // A first member: its state starts at the group's first point.
            let point = Point::first(&MEMBERS);
            let mut snapshot = Snapshot::default();
            let metadata = snapshot.mut_metadata();
            (metadata.index, metadata.term) = (point.index, point.term);
            metadata.set_conf_state(point.conf_state);
            save(&self.dir, &snapshot).unwrap();
        }
        let (covered, machine, snapshot) = match fs::read(snapshot_path(&self.dir)) {
            Ok(bytes) => {
                let snapshot = Snapshot::parse_from_bytes(&bytes).unwrap();
                let metadata = snapshot.get_metadata();
                let point =
                    Point { index: metadata.index, term: metadata.term, conf_state: metadata.get_conf_state().clone() };
                let mut machine = Applied { dir: self.dir.clone(), ..Applied::default() };
                machine.load(&snapshot);
                (Some(point), machine, Some(snapshot))
            }
            Err(_) => (None, Applied { dir: self.dir.clone(), ..Applied::default() }, None),
        };
        let mut node = Node::open(self.id, &self.dir.join("raft"), covered.as_ref(), TIMING).unwrap();
        self.last_snapshot = node.applied_index();
        node.log_mut().set_sync(false);
        // Each member keeps a different share of its entries in memory
        // (all, some, none): whoever leads, entries are read back from
        // disk and from memory.
        node.log_mut().set_cache_bytes([CACHE_BYTES_MAX, 300, 0][(self.id - 1) as usize % 3]);
        rejitter(&mut node, rng);
        if let Some(snapshot) = snapshot {
            node.log_mut().offer_snapshot(snapshot);
        }
        self.running = Some((node, machine));
    }

    /// Takes a snapshot of the state and restarts the log after it, once
    /// `SNAPSHOT_EVERY` entries have been applied since the last.
    fn maybe_snapshot(&mut self) {
        let Some((node, machine)) = &mut self.running else { return };
        // The point is Raft's applied index: entries without data (a new
        // leader's) count, and change nothing of the state.
        let applied = node.applied_index();
        if applied < self.last_snapshot + SNAPSHOT_EVERY {
            return;
        }
        let term = node.term_of(applied).expect("the last applied entry is in the log");
        let point = Point { index: applied, term, conf_state: node.conf_state() };
        let mut snapshot = Snapshot { data: encode_items(&machine.items).into(), ..Snapshot::default() };
        let metadata = snapshot.mut_metadata();
        (metadata.index, metadata.term) = (point.index, point.term);
        metadata.set_conf_state(point.conf_state.clone());
        save(&self.dir, &snapshot).unwrap();
        node.log_mut().restart_after(&point).unwrap();
        node.log_mut().offer_snapshot(snapshot);
        self.last_snapshot = point.index;
    }
}

/// Draws a node's election timeout from the simulation's generator
/// whenever Raft has just reset it (it draws from the thread's own, which
/// no seed reaches), so that a seed replays a run exactly. Any timeout in
/// Raft's range is one it could have drawn itself.
fn rejitter(node: &mut Node, rng: &mut StdRng) {
    if node.raw.raft.election_elapsed == 0 {
        let ticks = TIMING.election_ticks;
        node.raw.raft.set_randomized_election_timeout(rng.gen_range(ticks..2 * ticks));
    }
}

/// What the clients did: each proposal's step, and when and where it was
/// acknowledged.
#[derive(Default)]
struct History {
    proposed: HashMap<Vec<u8>, u64>,
    /// Per origin, its proposals not yet acknowledged.
    waiting: BTreeMap<u64, BTreeSet<Vec<u8>>>,
    acknowledged: HashMap<Vec<u8>, u64>,
}

/// Per-link queues, first in first out as on a TCP connection.
type Links = BTreeMap<(u64, u64), VecDeque<Message>>;

struct Sim {
    rng: StdRng,
    members: Vec<Member>,
    links: Links,
    /// Links cut, both ways: (lower id, higher id).
    cut: BTreeSet<(u64, u64)>,
    history: History,
    step: u64,
    crashes: u64,
    cuts: u64,
    snapshots_sent: u64,
    /// Snapshots a follower installed.
    installs: u64,
    _dirs: tempfile::TempDir,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let dirs = tempfile::tempdir().unwrap();
        let members: Vec<Member> = MEMBERS
            .iter()
            .map(|&id| Member {
                id,
                dir: dirs.path().join(id.to_string()),
                running: None,
                down_until: 0,
                last_snapshot: 0,
            })
            .collect();
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            members,
            links: Links::new(),
            cut: BTreeSet::new(),
            history: History::default(),
            step: 0,
            crashes: 0,
            cuts: 0,
            snapshots_sent: 0,
            installs: 0,
            _dirs: dirs,
        };
        for member in &mut sim.members {
            fs::create_dir_all(&member.dir).unwrap();
            member.start(&mut sim.rng);
        }
        sim
    }

    fn is_cut(&self, a: u64, b: u64) -> bool {
        self.cut.contains(&(a.min(b), a.max(b)))
    }

    /// Crashes, restarts and cuts, at random.
    fn faults(&mut self) {
        // Up to two of the three down at once: a majority lost for a while
        // may cost availability, never an acknowledged entry.
        let running: Vec<usize> = (0..self.members.len()).filter(|&i| self.members[i].running.is_some()).collect();
        if running.len() > 1 && self.rng.gen_bool(0.004) {
            let i = running[self.rng.gen_range(0..running.len())];
            self.crash(i);
        }
        for member in &mut self.members {
            if member.running.is_none() && member.down_until <= self.step {
                member.start(&mut self.rng);
            }
        }
        if self.rng.gen_bool(0.004) {
            self.cuts += 1;
            self.cut.clear();
            match self.rng.gen_range(0..3) {
                // One node cut off from both others.
                0 => {
                    let alone = MEMBERS[self.rng.gen_range(0..MEMBERS.len())];
                    for other in MEMBERS.into_iter().filter(|&other| other != alone) {
                        self.cut.insert((alone.min(other), alone.max(other)));
                    }
                }
                // One link: a bridge through the third node.
                1 => {
                    let a = self.rng.gen_range(0..MEMBERS.len());
                    let (x, y) = (MEMBERS[a], MEMBERS[(a + 1) % MEMBERS.len()]);
                    self.cut.insert((x.min(y), x.max(y)));
                }
                _ => {}
            }
        }
    }

    /// A crash: the node's memory is gone (with what it had not synced),
    /// and its connections with it.
    fn crash(&mut self, i: usize) {
        let id = self.members[i].id;
        self.crashes += 1;
        self.members[i].running = None;
        self.members[i].down_until = self.step + self.rng.gen_range(20..200);
        if let Some(waiting) = self.history.waiting.get_mut(&id) {
            waiting.clear();
        }
        let links: Vec<(u64, u64)> = self.links.keys().copied().filter(|&(from, to)| from == id || to == id).collect();
        for link in links {
            let lost = self.links.remove(&link).unwrap_or_default();
            self.report_lost(link, &lost);
        }
    }

    /// Tells a sender of lost snapshots that they did not arrive.
    fn report_lost(&mut self, (from, to): (u64, u64), lost: &VecDeque<Message>) {
        if lost.iter().any(|m| m.get_msg_type() == MessageType::MsgSnapshot) {
            if let Some((node, _)) = &mut self.members[(from - 1) as usize].running {
                node.snapshot_sent(to, false);
            }
        }
    }

    fn deliver(&mut self) {
        let links: Vec<(u64, u64)> = self.links.keys().copied().collect();
        for (from, to) in links {
            if self.is_cut(from, to) {
                let lost = self.links.remove(&(from, to)).unwrap_or_default();
                self.report_lost((from, to), &lost);
                continue;
            }
            for _ in 0..self.rng.gen_range(0..4) {
                let Some(message) = self.links.get_mut(&(from, to)).and_then(VecDeque::pop_front) else { break };
                let snapshot = message.get_msg_type() == MessageType::MsgSnapshot;
                let lost = self.rng.gen_bool(0.02);
                if !lost {
                    if let Some((node, _)) = &mut self.members[(to - 1) as usize].running {
                        node.step(message).expect("a message raft made passes the checks");
                        rejitter(node, &mut self.rng);
                    }
                }
                if snapshot {
                    self.snapshots_sent += 1;
                    if let Some((node, _)) = &mut self.members[(from - 1) as usize].running {
                        node.snapshot_sent(to, !lost);
                    }
                }
            }
        }
    }

    fn propose(&mut self, seq: &mut u64) {
        if !self.rng.gen_bool(0.3) {
            return;
        }
        let i = self.rng.gen_range(0..self.members.len());
        let member = &mut self.members[i];
        let Some((node, _)) = &mut member.running else { return };
        *seq += 1;
        let data = format!("{}:{seq}", member.id).into_bytes();
        if node.propose(data.clone()) {
            self.history.proposed.insert(data.clone(), self.step);
            self.history.waiting.entry(member.id).or_default().insert(data);
        }
    }

    /// Every running node ticks, carries out its `Ready`, sends, and
    /// acknowledges what it applied of its own proposals.
    fn run_nodes(&mut self, tick: bool) {
        let mut out = Vec::new();
        for member in &mut self.members {
            let id = member.id;
            let Some((node, machine)) = &mut member.running else { continue };
            if tick {
                node.tick();
                rejitter(node, &mut self.rng);
            }
            node.advance(machine, &mut out).unwrap();
            rejitter(node, &mut self.rng);
            if std::mem::take(&mut machine.restored) {
                self.installs += 1;
            }
            for data in machine.fresh.drain(..) {
                let waiting = self.history.waiting.entry(id).or_default();
                if waiting.remove(&data) {
                    self.history.acknowledged.insert(data, self.step);
                }
            }
            for message in out.drain(..) {
                assert_eq!(message.from, id);
                self.links.entry((id, message.to)).or_default().push_back(message);
            }
            member.maybe_snapshot();
        }
    }

    fn run(&mut self, steps: u64) {
        let mut seq = 0;
        for _ in 0..steps {
            self.step += 1;
            self.faults();
            self.deliver();
            self.propose(&mut seq);
            self.run_nodes(true);
        }
    }

    /// Restarts every node, mends every link, and runs until every node
    /// has applied all that is committed.
    fn heal(&mut self) {
        self.cut.clear();
        for member in self.members.iter_mut().filter(|member| member.running.is_none()) {
            member.start(&mut self.rng);
        }
        for _ in 0..5000 {
            self.step += 1;
            self.deliver();
            self.run_nodes(true);
            let indexes: Vec<(u64, u64)> = self
                .members
                .iter()
                .map(|m| m.running.as_ref().map(|(node, _)| (node.commit_index(), node.applied_index())).unwrap())
                .collect();
            let leader = self.members.iter().any(|m| m.running.as_ref().unwrap().0.role() == StateRole::Leader);
            if leader && indexes.iter().all(|&(commit, applied)| commit == indexes[0].0 && applied == commit) {
                return;
            }
        }
        let states: Vec<String> = self
            .members
            .iter()
            .map(|m| {
                let node = &m.running.as_ref().unwrap().0;
                format!(
                    "{}: {:?} term {} leader {:?} commit {} applied {}",
                    node.id(),
                    node.role(),
                    node.term(),
                    node.leader(),
                    node.commit_index(),
                    node.applied_index()
                )
            })
            .collect();
        panic!("the group did not settle after healing: {states:?}");
    }

    fn check(&self, seed: u64) {
        let items = &self.members[0].running.as_ref().unwrap().1.items;
        for member in &self.members[1..] {
            assert_eq!(&member.running.as_ref().unwrap().1.items, items, "seed {seed}: the nodes differ");
        }
        let mut at = HashMap::new();
        for (position, item) in items.iter().enumerate() {
            assert!(self.history.proposed.contains_key(item), "seed {seed}: an entry nobody proposed");
            assert!(at.insert(item.clone(), position).is_none(), "seed {seed}: an entry applied twice");
        }
        for (item, acknowledged) in &self.history.acknowledged {
            let Some(&position) = at.get(item) else { panic!("seed {seed}: an acknowledged proposal is lost") };
            for (later, proposed) in &self.history.proposed {
                if proposed > acknowledged {
                    if let Some(&after) = at.get(later) {
                        assert!(after > position, "seed {seed}: proposed after an acknowledgement, applied before it");
                    }
                }
            }
        }
        assert!(self.history.acknowledged.len() > 50, "seed {seed}: too few acknowledged to mean much");
    }
}

#[test]
fn a_seed_replays_its_run_exactly() {
    let run = |seed| {
        let mut sim = Sim::new(seed);
        sim.run(1500);
        let applied: Vec<Vec<Vec<u8>>> = sim
            .members
            .iter()
            .map(|m| m.running.as_ref().map_or(Vec::new(), |(_, machine)| machine.items.clone()))
            .collect();
        (applied, sim.history.acknowledged.len(), sim.crashes, sim.cuts, sim.snapshots_sent)
    };
    assert_eq!(run(7), run(7));
}

#[test]
fn a_group_under_loss_cuts_and_crashes_agrees_and_loses_nothing_acknowledged() {
    let mut faults = [0; 4];
    for seed in 1..=20 {
        let mut sim = Sim::new(seed);
        sim.run(3000);
        sim.heal();
        sim.check(seed);
        eprintln!(
            "seed {seed}: {} proposed, {} acknowledged, {} applied, {} crashes, {} cuts, {} snapshots sent, {} \
             installed",
            sim.history.proposed.len(),
            sim.history.acknowledged.len(),
            sim.members[0].running.as_ref().unwrap().1.items.len(),
            sim.crashes,
            sim.cuts,
            sim.snapshots_sent,
            sim.installs
        );
        for (total, count) in faults.iter_mut().zip([sim.crashes, sim.cuts, sim.snapshots_sent, sim.installs]) {
            *total += count;
        }
    }
    // The runs reached every path they claim to test.
    assert!(faults.iter().all(|&total| total > 0), "crashes, cuts, snapshots sent, installed: {faults:?}");
}

#[test]
fn checks_refuse_what_raft_would_panic_on() {
    let me = 2;
    let message = |kind: MessageType, term: u64, entries: usize| {
        let mut message = Message { to: me, from: 1, term, ..Message::default() };
        message.set_msg_type(kind);
        message.entries = (0..entries).map(|i| Entry { index: 5 + i as u64, term: 1, ..Entry::default() }).collect();
        message.index = 4;
        message
    };
    assert_eq!(check_message(&message(MessageType::MsgAppend, 3, 2), me), Ok(()));
    assert_eq!(check_message(&message(MessageType::MsgPropose, 0, 1), me), Ok(()));
    assert_eq!(check_message(&message(MessageType::MsgRequestVote, 0, 0), me), Err(Refused::NoTerm));
    assert_eq!(check_message(&message(MessageType::MsgPropose, 0, 0), me), Err(Refused::BadEntries));
    assert_eq!(check_message(&message(MessageType::MsgReadIndex, 0, 2), me), Err(Refused::BadEntries));
    assert_eq!(check_message(&message(MessageType::MsgHup, 3, 0), me), Err(Refused::LocalKind));
    let mut gap = message(MessageType::MsgAppend, 3, 2);
    gap.entries[1].index = 9;
    assert_eq!(check_message(&gap, me), Err(Refused::BadEntries));
    let mut termless_entry = message(MessageType::MsgAppend, 3, 2);
    termless_entry.entries[1].term = 0;
    assert_eq!(check_message(&termless_entry, me), Err(Refused::BadEntries));
    let mut from_the_future = message(MessageType::MsgAppend, 3, 2);
    from_the_future.entries[0].term = 4;
    assert_eq!(check_message(&from_the_future, me), Err(Refused::BadEntries));
    let mut elsewhere = message(MessageType::MsgHeartbeat, 3, 0);
    elsewhere.to = 3;
    assert_eq!(check_message(&elsewhere, me), Err(Refused::NotForMe));
    let mut from_self = message(MessageType::MsgHeartbeat, 3, 0);
    from_self.from = me;
    assert_eq!(check_message(&from_self, me), Err(Refused::BadSender));
    let mut overflow = message(MessageType::MsgAppend, 3, 1);
    overflow.index = u64::MAX;
    assert_eq!(check_message(&overflow, me), Err(Refused::BadEntries));
    let mut snapshot = message(MessageType::MsgSnapshot, 3, 0);
    assert_eq!(check_message(&snapshot, me), Err(Refused::BadSnapshot));
    let metadata = snapshot.mut_snapshot().mut_metadata();
    (metadata.index, metadata.term) = (5, 2);
    metadata.mut_conf_state().voters = vec![1, 2, 3];
    assert_eq!(check_message(&snapshot, me), Ok(()));
    // Configurations Raft would panic restoring: refused.
    for (voters, learners) in [(vec![], vec![4]), (vec![1, 2], vec![2]), (vec![1, 1], vec![]), (vec![0, 1], vec![])] {
        let conf = snapshot.mut_snapshot().mut_metadata().mut_conf_state();
        (conf.voters, conf.learners) = (voters.clone(), learners.clone());
        assert_eq!(check_message(&snapshot, me), Err(Refused::BadSnapshot), "{voters:?} {learners:?}");
    }
    // Against a log ending at entry 10.
    let mut heartbeat = message(MessageType::MsgHeartbeat, 3, 0);
    heartbeat.commit = 10;
    assert_eq!(check_against_log(&heartbeat, 10), Ok(()));
    heartbeat.commit = 11;
    assert_eq!(check_against_log(&heartbeat, 10), Err(Refused::PastTheLog));
    let mut acknowledged = message(MessageType::MsgAppendResponse, 3, 0);
    acknowledged.index = 11;
    assert_eq!(check_against_log(&acknowledged, 10), Err(Refused::PastTheLog));
    acknowledged.reject = true;
    assert_eq!(check_against_log(&acknowledged, 10), Ok(()));
    let mut termless = message(MessageType::MsgAppend, 3, 1);
    termless.log_term = 0;
    assert_eq!(check_against_log(&termless, 10), Err(Refused::PastTheLog));
}

/// A follower far behind is sent its entries a window at a time: what the
/// leader queues for it between two deliveries (its entries' bytes) stays
/// within half of what a peer link holds (`peers::OUTGOING_BYTES_MAX`, the
/// link's limit, with room for heartbeats and answers). A window larger
/// than the link was refused in part, and Raft sent again what had gone.
#[test]
fn a_follower_far_behind_is_sent_a_window_a_link_holds() {
    const ENTRY_BYTES: usize = 3 << 19;
    let mut sim = Sim::new(34);
    sim.heal();
    let leader = sim.members.iter().position(|m| m.running.as_ref().unwrap().0.role() == StateRole::Leader).unwrap();
    let behind = (leader + 1) % MEMBERS.len();
    sim.crash(behind);
    // Under `SNAPSHOT_EVERY` entries: the follower gets them, not the state.
    let entries = SNAPSHOT_EVERY as usize - 4;
    let (leader_id, behind_id) = (sim.members[leader].id, sim.members[behind].id);
    let last = sim.members[leader].running.as_ref().unwrap().0.applied_index() + entries as u64;
    for n in 0..entries {
        assert!(sim.members[leader].running.as_mut().unwrap().0.propose(vec![n as u8; ENTRY_BYTES]));
    }
    sim.members[behind].start(&mut sim.rng);
    let mut queued_max = 0;
    for _ in 0..5000 {
        sim.step += 1;
        sim.run_nodes(true);
        let queued: usize = sim.links.get(&(leader_id, behind_id)).map_or(0, |link| {
            link.iter().flat_map(|message| message.get_entries()).map(|entry| entry.data.len()).sum()
        });
        queued_max = queued_max.max(queued);
        sim.deliver();
        if sim.members[behind].running.as_ref().unwrap().0.applied_index() >= last {
            break;
        }
    }
    assert!(sim.members[behind].running.as_ref().unwrap().0.applied_index() >= last, "the follower did not catch up");
    assert!(entries * ENTRY_BYTES > crate::cluster::peers::OUTGOING_BYTES_MAX / 2, "behind by more than a window");
    assert!(
        queued_max <= crate::cluster::peers::OUTGOING_BYTES_MAX / 2,
        "{queued_max} bytes of entries queued for one follower at once"
    );
}

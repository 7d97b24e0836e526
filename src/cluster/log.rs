//! The Raft log on disk: what `raft` asks a node to keep (entries, hard
//! state, configuration), in the write-ahead log's segments and framing.
//!
//! ```text
//! entry      (16) = index:u64 term:u64 kind:u8 data_len:u32 data context_len:u32 context
//! hard state (17) = term:u64 vote:u64 commit:u64
//! conf state (18) = index:u64 voters learners voters_outgoing learners_next auto_leave:u8
//!                   (each list: count:u32 id:u64*count)
//! base       (19) = index:u64 term:u64
//! ```
//!
//! Records are appended as a `Ready` asks and synced by `sync`, once for
//! all of them, before the messages that depend on them leave. Reading the
//! segments back in order rebuilds the log:
//!
//! - An entry whose index is at or below the last one's replaces it and
//!   every entry after it: a leader overwrote an uncommitted suffix, and
//!   the log drops it on replay as it did in memory.
//! - A base record says the log restarts after `(index, term)`: every
//!   entry before it is dropped. `restart_after` writes one first in a new
//!   segment, after a snapshot (taken here, or sent by the leader) covers
//!   the entries before it; the entries it keeps follow in the same
//!   segment, which is renamed into place only once whole and synced, and
//!   the older segments are then removed.
//! - The last hard state counts.
//! - The configuration is the one at a snapshot's point, written with it:
//!   the changes after it are entries, applied again, in order, after a
//!   restart, as Raft replays every entry after the state's point. A group
//!   starts from a snapshot too (`Point::first`): the empty state at entry
//!   1 of term 1, with the first voters, the same on each of them. So no
//!   log holds entry 1, and a node added later learns the members from the
//!   snapshot it is sent, never from a log that lacks the first ones.
//!
//! The entries live in the segments; memory holds each one's term and
//! place, and the last ones appended whole (up to `CACHE_BYTES_MAX`): those
//! Raft reads next, to apply them and to send them to followers keeping up.
//! Older ones are read back from their records when asked (a follower far
//! behind, a restart applying the log again), so a node holds its indexes
//! once, not again in its log.
//!
//! A state snapshot and the log must agree on the point the snapshot
//! stands for. `open` takes that point from the snapshot's manifest (where
//! it is written in the same rename as the data): where the log does not
//! hold the snapshot's last entry with its term, its entries after it are
//! from an older leadership and are dropped.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::files::{forget_whole_pages, sync_dir};
use crate::log as oplog;
use crate::wal::frame::{self, DecodeError, Reader};
use crate::wal::{self, Place, ReplayError};

const ENTRY: u8 = 16;
const HARD_STATE: u8 = 17;
const CONF_STATE: u8 = 18;
const BASE: u8 = 19;

/// Bytes an entry adds to a message besides its data and context.
const ENTRY_OVERHEAD_BYTES: u64 = 32;

/// The buffer of entries awaiting their sync is kept up to this size: a
/// follower catching up appends many whole batches a turn, and fresh
/// memory for each costs more than the copy into it. As much as one peer
/// link may hold (`peers::OUTGOING_BYTES_MAX`).
const PENDING_KEEP_BYTES_MAX: usize = 64 << 20;

/// The entries kept in memory besides their records, the last appended:
/// what Raft reads next, to apply them and to send them to the followers
/// keeping up (`node` asserts it holds a window of appends to one and the
/// entries one `Ready` applies). Each node touches this much fresh memory
/// once, then reuses it.
pub const CACHE_BYTES_MAX: u64 = 64 << 20;

/// Records read back in one read: the entries of one message, most often,
/// and a bound on the buffer of one read besides.
const RUN_BYTES_MAX: u64 = 16 << 20;

/// Bytes between two entries' records that one read still takes rather
/// than read each apart: a hard state, or a short suffix overwritten.
const RUN_GAP_BYTES_MAX: u64 = 64 << 10;

/// One record of the Raft log, as a replay reads it.
#[derive(Debug, PartialEq)]
enum Item {
    /// An entry's index and term, and the bytes a message carries of it:
    /// its data is read back from the record when asked.
    Entry {
        index: u64,
        term: u64,
        size: u64,
    },
    HardState(HardState),
    /// A configuration and the index of the entry that made it.
    ConfState(u64, ConfState),
    Base {
        index: u64,
        term: u64,
    },
}

/// Where a state snapshot stands in the log: its last entry's index and
/// term, and the configuration at that entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    pub index: u64,
    pub term: u64,
    pub conf_state: ConfState,
}

impl Point {
    /// Where a new group starts, on each of its first `voters`: the empty
    /// state at entry 1 of term 1.
    pub fn first(voters: &[u64]) -> Point {
        Point { index: 1, term: 1, conf_state: ConfState { voters: voters.to_vec(), ..ConfState::default() } }
    }

    /// `index:u64 term:u64` and the configuration as a conf state record holds it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.index);
        put_u64(out, self.term);
        put_conf_state(&self.conf_state, out);
    }

    pub fn decode(fields: &mut Reader<'_>) -> Option<Point> {
        let (index, term) = (fields.u64()?, fields.u64()?);
        Some(Point { index, term, conf_state: read_conf_state(fields)? })
    }
}

/// An entry of the log: its term, where its record is, and the entry
/// itself while it is among the last appended.
#[derive(Debug)]
struct Slot {
    term: u64,
    /// The bytes a message carries of it: `ENTRY_OVERHEAD_BYTES`, its data
    /// and its context.
    size: u64,
    place: Place,
    /// Boxed: most entries of a long log are not cached, and take no room for it.
    cached: Option<Box<Entry>>,
}

/// The log as it stands: what `raft` reads through `Storage`.
#[derive(Debug, Default)]
struct Kept {
    /// The entries after `base`, in order: `entries[i]` is entry
    /// `base.0 + 1 + i`.
    entries: VecDeque<Slot>,
    /// The index and term of the entry before the first kept: the last
    /// snapshot's, or (0, 0).
    base: (u64, u64),
    hard_state: HardState,
    /// The configuration, and the index of the entry that made it.
    conf_state: (u64, ConfState),
    /// The entries from this index on are cached, those before it are not
    /// (it may lie past either end: then all are, or none).
    cached_from: u64,
    /// The sizes of the entries cached.
    cached_bytes: u64,
}

impl Kept {
    /// Applies one record read back, at `place`; `Err((after, found))` for a gap.
    fn replay(&mut self, item: Item, place: Place) -> Result<(), (u64, u64)> {
        match item {
            Item::Entry { index, term, size } => {
                if index <= self.base.0 {
                    return Ok(());
                }
                let last = self.last_index();
                if index > last + 1 {
                    return Err((last, index));
                }
                self.drop_after(index - 1);
                self.entries.push_back(Slot { term, size, place, cached: None });
                self.cached_from = index + 1;
            }
            Item::HardState(hard_state) => self.hard_state = hard_state,
            Item::ConfState(at, conf_state) => self.conf_state = (at, conf_state),
            Item::Base { index, term } => self.restart(index, term),
        }
        Ok(())
    }

    /// Drops every entry after `index` (at or after the base).
    fn drop_after(&mut self, index: u64) {
        let keep = (index - self.base.0) as usize;
        let dropped = self.entries.range(keep..).filter(|slot| slot.cached.is_some());
        self.cached_bytes -= dropped.map(|slot| slot.size).sum::<u64>();
        self.entries.truncate(keep);
        self.cached_from = self.cached_from.min(index + 1);
    }

    /// Drops every entry up to `index` (kept, or the base), which becomes
    /// the base, of `term`.
    fn drop_through(&mut self, index: u64, term: u64) {
        let dropped = self.entries.drain(..(index - self.base.0) as usize);
        self.cached_bytes -= dropped.filter(|slot| slot.cached.is_some()).map(|slot| slot.size).sum::<u64>();
        self.base = (index, term);
        self.cached_from = self.cached_from.max(index + 1);
    }

    /// Drops every entry; the log goes on after `(index, term)`.
    fn restart(&mut self, index: u64, term: u64) {
        self.entries.clear();
        self.base = (index, term);
        self.cached_from = index + 1;
        self.cached_bytes = 0;
    }

    /// Drops the oldest entries cached from memory (their records keep
    /// them) until those left take at most `bytes_max`.
    fn uncache(&mut self, bytes_max: u64) {
        self.cached_from = self.cached_from.max(self.base.0 + 1);
        while self.cached_bytes > bytes_max && self.cached_from <= self.last_index() {
            let slot = &mut self.entries[(self.cached_from - self.base.0 - 1) as usize];
            assert!(slot.cached.take().is_some(), "the entries from cached_from on are cached");
            self.cached_bytes -= slot.size;
            self.cached_from += 1;
        }
    }

    /// Drops what the state snapshot at `point` covers: the entries up to
    /// it (but those after `keep_after`, for a follower still reading
    /// them), and the entries after it unless the log holds its last entry
    /// with its term (then they follow it, by Raft's log matching).
    fn cover(&mut self, point: &Point, keep_after: u64) {
        if point.index < self.base.0 {
            return;
        }
        let keep_after = keep_after.clamp(self.base.0, point.index);
        match (self.term_of(point.index), self.term_of(keep_after)) {
            (Some(term), Some(base_term)) if term == point.term => self.drop_through(keep_after, base_term),
            _ => self.restart(point.index, point.term),
        }
        self.hard_state.commit = self.hard_state.commit.max(point.index);
        self.hard_state.term = self.hard_state.term.max(point.term);
        if point.index >= self.conf_state.0 {
            self.conf_state = (point.index, point.conf_state.clone());
        }
    }

    /// The term of the entry at `index`, if the log knows it.
    fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.base.0 {
            return Some(self.base.1);
        }
        let at = index.checked_sub(self.base.0 + 1)?;
        self.entries.get(at as usize).map(|entry| entry.term)
    }

    fn last_index(&self) -> u64 {
        self.base.0 + self.entries.len() as u64
    }
}

/// The Raft log of one replication group, kept in segment files under one
/// directory: `raft::Storage` over the entries (the last ones cached in
/// memory, the others read back), and the appends that make them durable.
pub struct LogStore {
    dir: PathBuf,
    log: wal::Log,
    kept: Kept,
    /// The snapshot to send a follower behind the entries kept, when one
    /// is ready.
    snapshot: Option<Snapshot>,
    /// Whether Raft asked for a snapshot newer than the one offered (or
    /// for one while none was): the caller makes one and offers it.
    wanted: Cell<bool>,
    /// Whether `sync` calls fdatasync (off only where a test models the
    /// disk itself).
    sync: bool,
    /// The bytes the segment began with at the last restart (the entries
    /// kept): not growth since the last snapshot.
    carried_bytes: u64,
    /// A restart that failed half-way: what is appended after it might
    /// land before its base, and be dropped on replay, so nothing more is
    /// synced.
    broken: bool,
    /// `CACHE_BYTES_MAX`, but where a test reads every entry back from disk.
    cache_bytes_max: u64,
    /// Each segment of the log, open for reading entries back: opened with
    /// the segment, so that a read never needs a descriptor the process may
    /// have run out of (clients hold the others), which would stop the node.
    readers: BTreeMap<u64, File>,
}

/// Why the Raft log could not be read back.
#[derive(Debug)]
pub enum OpenError {
    Replay(ReplayError),
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// An entry that does not follow the one before it.
    Gap {
        after: u64,
        found: u64,
    },
    /// The state was loaded from a point before the first entry the log
    /// keeps: the entries between are gone.
    StateBehindLog {
        state: u64,
        log: u64,
    },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Replay(error) => write!(f, "{error}"),
            OpenError::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            OpenError::Gap { after, found } => {
                write!(f, "the Raft log is damaged: entry {found} follows entry {after}")
            }
            OpenError::StateBehindLog { state, log } => write!(
                f,
                "the data directory's state stands at entry {state}, but its Raft log starts after entry {log}: the \
                 entries between are gone"
            ),
        }
    }
}

impl std::error::Error for OpenError {}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io { action, path: path.to_owned(), source }
}

impl LogStore {
    /// Reads the log in `dir` (made if missing) back, its entries up to
    /// `covered` (a state snapshot's point, if there is one) dropped.
    pub fn open(dir: &Path, covered: Option<&Point>) -> Result<LogStore, OpenError> {
        fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        remove_partial_segments(dir)?;
        let mut kept = Kept::default();
        let mut gap = None;
        let replayed = wal::replay(dir, (0, false), decode, |item, place| {
            // A base supersedes all before it: segments that a restart
            // had not finished removing may leave a gap behind one.
            if matches!(item, Item::Base { .. }) {
                gap = None;
            }
            if let Err(found) = kept.replay(item, place) {
                gap.get_or_insert(found);
            }
        })
        .map_err(OpenError::Replay)?;
        if let Some((after, found)) = gap {
            return Err(OpenError::Gap { after, found });
        }
        kept.hard_state.commit = kept.hard_state.commit.max(kept.base.0).min(kept.last_index());
        let next = replayed.last.map_or(0, |last| last + 1);
        let mut log = wal::Log::create(dir, next).map_err(io_error("start", &wal::segment_path(dir, next)))?;
        log.set_keep_bytes(PENDING_KEEP_BYTES_MAX);
        let mut readers = BTreeMap::new();
        for segment in wal::segments(dir).map_err(io_error("list", dir))? {
            let path = wal::segment_path(dir, segment);
            readers.insert(segment, File::open(&path).map_err(io_error("open", &path))?);
        }
        let mut store = LogStore {
            dir: dir.to_owned(),
            log,
            kept,
            snapshot: None,
            wanted: Cell::new(false),
            sync: true,
            carried_bytes: 0,
            broken: false,
            cache_bytes_max: CACHE_BYTES_MAX,
            readers,
        };
        // A snapshot that covers more than the log knows (taken, or sent,
        // just before a crash): the log restarts after it on disk too, or
        // entries dropped here would come back on the next replay.
        if let Some(point) = covered.filter(|point| point.index > store.kept.base.0) {
            store.restart_after(point).map_err(io_error("restart", dir))?;
        }
        Ok(store)
    }

    /// Appends `entries` (of a `Ready`), replacing the log from the first
    /// one's index on. Durable after the next `sync`.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        let (base, last) = (self.kept.base.0, self.kept.last_index());
        assert!(
            first.index > base && first.index <= last + 1,
            "entries from {} appended to a log of {}..={last}",
            first.index,
            base + 1,
        );
        self.kept.drop_after(first.index - 1);
        for entry in entries {
            let (segment, offset) = (self.log.segment(), self.log.end());
            self.log.append_with(|out| encode_entry(entry, out));
            let place = Place { segment, offset, len: self.log.end() - offset };
            let size = entry_size(entry);
            self.kept.entries.push_back(Slot { term: entry.term, size, place, cached: Some(Box::new(entry.clone())) });
            self.kept.cached_bytes += size;
        }
    }

    /// Notes a new hard state (term, vote, commit). Durable after the next `sync`.
    pub fn set_hard_state(&mut self, hard_state: &HardState) {
        if *hard_state != self.kept.hard_state {
            self.kept.hard_state = hard_state.clone();
            self.log.append_with(|out| encode_hard_state(hard_state, out));
        }
    }

    /// The hard state last noted.
    pub fn hard_state(&self) -> &HardState {
        &self.kept.hard_state
    }

    /// Whether `sync` calls fdatasync: off only where a test models the
    /// disk itself (a crash there loses what was not written).
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
        self.log.set_sync(sync);
    }

    /// Where a test reads every entry back from its record: at most
    /// `bytes` of entries kept in memory too.
    pub fn set_cache_bytes(&mut self, bytes: u64) {
        self.cache_bytes_max = bytes;
    }

    /// Writes and syncs what was appended: one `fdatasync` for all of it.
    /// The oldest entries then leave memory past `CACHE_BYTES_MAX`: their
    /// records hold them.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other("the Raft log's restart after a snapshot failed; restart the node"));
        }
        self.log.commit()?;
        self.kept.uncache(self.cache_bytes_max);
        Ok(())
    }

    /// Offers `snapshot` to followers too far behind for the entries kept.
    pub fn offer_snapshot(&mut self, snapshot: Snapshot) {
        self.snapshot = Some(snapshot);
    }

    /// Whether Raft asked for a snapshot the log could not give, since the last call.
    pub fn take_snapshot_wanted(&mut self) -> bool {
        self.wanted.take()
    }

    /// The bytes written since the log last restarted: what a state
    /// snapshot would let it drop.
    pub fn bytes(&self) -> u64 {
        self.log.segment_bytes() - self.carried_bytes
    }

    /// Restarts the log after `point`, which a state snapshot now covers
    /// (one taken here, or one the leader sent): keeps the entries after
    /// it if the log holds its last entry with its term, drops the rest,
    /// and writes what remains into a new segment, made whole and synced
    /// before it replaces every older one.
    pub fn restart_after(&mut self, point: &Point) -> io::Result<()> {
        self.restart_keeping(point, point.index)
    }

    /// `restart_after`, keeping the entries after `keep_after` (before the
    /// point) that a follower still reads: it gets them, not the state.
    pub fn restart_keeping(&mut self, point: &Point, keep_after: u64) -> io::Result<()> {
        self.sync()?;
        self.broken = true;
        self.write_after(point, keep_after)
    }

    /// The bytes of the entries after `after` up to `to`, as messages carry them.
    pub fn bytes_between(&self, after: u64, to: u64) -> u64 {
        let from = after.saturating_sub(self.kept.base.0) as usize;
        let to = (to.saturating_sub(self.kept.base.0) as usize).min(self.kept.entries.len());
        self.kept.entries.range(from.min(to)..to).map(|slot| slot.size).sum()
    }

    /// `restart_keeping` once what was appended is synced; mends `broken`
    /// once appends go to the new segment.
    fn write_after(&mut self, point: &Point, keep_after: u64) -> io::Result<()> {
        self.kept.cover(point, keep_after);
        let next = self.log.segment() + 1;
        let mut bytes = wal::segment_header().to_vec();
        encode_base(self.kept.base, &mut bytes);
        // The entries kept, the older from their records as they are,
        // and where each will be.
        let mut places = Vec::with_capacity(self.kept.entries.len());
        let (on_disk, cached) = split_cached(&self.kept.entries);
        read_records(&self.readers, &on_disk, |_, record| {
            places.push(Place { segment: next, offset: bytes.len() as u64, len: record.len() as u64 });
            bytes.extend_from_slice(record);
            Ok(())
        })?;
        for entry in cached {
            let offset = bytes.len() as u64;
            encode_entry(entry, &mut bytes);
            places.push(Place { segment: next, offset, len: bytes.len() as u64 - offset });
        }
        encode_hard_state(&self.kept.hard_state, &mut bytes);
        encode_conf_state(self.kept.conf_state.0, &self.kept.conf_state.1, &mut bytes);
        let partial = self.dir.join(format!("{next:020}.partial"));
        let mut file = OpenOptions::new().write(true).create_new(true).open(&partial)?;
        // Read back only at the next start: kept out of the page cache.
        crate::files::write_uncached(&mut file, &bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&partial, wal::segment_path(&self.dir, next))?;
        sync_dir(&self.dir)?;
        for (slot, place) in self.kept.entries.iter_mut().zip(places) {
            slot.place = place;
        }
        let path = wal::segment_path(&self.dir, next);
        self.readers.insert(next, File::open(&path)?);
        self.log = wal::Log::resume(&self.dir, next, bytes.len() as u64)?;
        self.log.set_keep_bytes(PENDING_KEEP_BYTES_MAX);
        self.carried_bytes = bytes.len() as u64;
        self.log.set_sync(self.sync);
        self.broken = false;
        self.readers.retain(|&segment, _| segment >= next);
        for segment in wal::segments(&self.dir)?.into_iter().filter(|&segment| segment < next) {
            fs::remove_file(wal::segment_path(&self.dir, segment))?;
        }
        sync_dir(&self.dir)
    }

    /// Entries `first..` read back from `places`, their records, appended to `found`.
    fn read_back(&self, first: u64, places: &[Place], found: &mut Vec<Entry>) -> io::Result<()> {
        read_records(&self.readers, places, |buffer, record| {
            let index = first + found.len() as u64;
            let damaged = |why: &dyn std::fmt::Display| {
                let place = places[found.len()];
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "entry {index} of the Raft log, in segment {} at offset {}: {why}",
                        place.segment, place.offset
                    ),
                )
            };
            let (entry, _) = frame::decode(record, |kind, payload| read_entry(kind, payload, buffer))
                .map_err(|error| damaged(&error))?;
            if entry.index != index {
                return Err(damaged(&format_args!("the record holds entry {}", entry.index)));
            }
            found.push(entry);
            Ok(())
        })
    }
}

/// Consecutive entries of the log split where memory starts holding them:
/// the places of those before (to read back), then those after.
fn split_cached<'a>(slots: impl IntoIterator<Item = &'a Slot>) -> (Vec<Place>, Vec<&'a Entry>) {
    let mut slots = slots.into_iter().peekable();
    let mut on_disk = Vec::new();
    while let Some(slot) = slots.next_if(|slot| slot.cached.is_none()) {
        on_disk.push(slot.place);
    }
    let cached = slots.map(|slot| slot.cached.as_deref().expect("the entries from cached_from on are cached"));
    (on_disk, cached.collect())
}

/// Reads the records at `places` (in a log's order) back from their
/// segments (`readers`), handing each to `take` with the buffer it lies
/// in. Records close together are read at once, and the whole pages they
/// fill dropped from the page cache once read (`forget_whole_pages`): never
/// the page the log's next records go on.
fn read_records(
    readers: &BTreeMap<u64, File>,
    places: &[Place],
    mut take: impl FnMut(&Bytes, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = 0;
    while at < places.len() {
        let first = places[at];
        let mut end = at + 1;
        while let Some(next) = places.get(end) {
            let last = places[end - 1];
            let last_end = last.offset + last.len;
            let near = next.offset >= last_end && next.offset - last_end <= RUN_GAP_BYTES_MAX;
            if next.segment != first.segment || !near || next.offset + next.len - first.offset > RUN_BYTES_MAX {
                break;
            }
            end += 1;
        }
        let file = readers
            .get(&first.segment)
            .ok_or_else(|| io::Error::other(format!("segment {} of the log is not open", first.segment)))?;
        let len = places[end - 1].offset + places[end - 1].len - first.offset;
        let mut buffer = vec![0; len as usize];
        file.read_exact_at(&mut buffer, first.offset)?;
        forget_whole_pages(file, first.offset, len);
        let buffer = Bytes::from(buffer);
        for place in &places[at..end] {
            let from = (place.offset - first.offset) as usize;
            take(&buffer, &buffer[from..from + place.len as usize])?;
        }
        at = end;
    }
    Ok(())
}

/// Removes segments a `restart_after` began and never renamed.
fn remove_partial_segments(dir: &Path) -> Result<(), OpenError> {
    for entry in fs::read_dir(dir).map_err(io_error("list", dir))? {
        let path = entry.map_err(io_error("list", dir))?.path();
        if path.extension().is_some_and(|extension| extension == "partial") {
            fs::remove_file(&path).map_err(io_error("remove", &path))?;
        }
    }
    Ok(())
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState { hard_state: self.kept.hard_state.clone(), conf_state: self.kept.conf_state.1.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.kept.base.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(
            high <= self.kept.last_index() + 1,
            "entries up to {high} asked of a log ending at {}",
            self.kept.last_index()
        );
        let max_size = max_size.into().unwrap_or(u64::MAX);
        let from = (low - self.kept.base.0 - 1) as usize;
        let to = (high - self.kept.base.0 - 1) as usize;
        // As many as fit in `max_size`, but never none.
        let mut size = 0;
        let count = self.kept.entries.range(from..to).take_while(|slot| {
            size += slot.size;
            size == slot.size || size <= max_size
        });
        let (on_disk, cached) = split_cached(count);
        let mut found = Vec::with_capacity(on_disk.len() + cached.len());
        // Raft cannot go on without its log: it stops the node on this
        // error, as a failed sync does (said here, since it says nothing).
        if let Err(error) = self.read_back(low, &on_disk, &mut found) {
            oplog::error(
                "raft_log_unreadable",
                format_args!("cannot read the Raft log back in {}: {error}; the node stops", self.dir.display()),
            );
            return Err(raft::Error::Io(error));
        }
        found.extend(cached.into_iter().cloned());
        Ok(found)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index < self.kept.base.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.kept.term_of(index).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.kept.base.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.kept.last_index())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let fits = |snapshot: &Snapshot| {
            let metadata = snapshot.get_metadata();
            let conf = metadata.get_conf_state();
            // One older than the log's base is of no use (the entries just
            // after it are gone too), and a node it does not name as a
            // member refuses it.
            metadata.index >= request_index.max(self.kept.base.0).max(1)
                && [&conf.voters, &conf.learners, &conf.voters_outgoing, &conf.learners_next]
                    .iter()
                    .any(|ids| ids.contains(&to))
        };
        match &self.snapshot {
            Some(snapshot) if fits(snapshot) => Ok(snapshot.clone()),
            _ => {
                self.wanted.set(true);
                Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))
            }
        }
    }
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).expect("an entry under 4 GiB").to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_ids(out: &mut Vec<u8>, ids: &[u64]) {
    out.extend_from_slice(&u32::try_from(ids.len()).expect("fewer than 2^32 members").to_le_bytes());
    for &id in ids {
        put_u64(out, id);
    }
}

fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    let start = frame::begin(out);
    put_u64(out, entry.index);
    put_u64(out, entry.term);
    out.push(entry.get_entry_type() as u8);
    put_bytes(out, &entry.data);
    put_bytes(out, &entry.context);
    frame::end(out, start, ENTRY);
}

fn encode_hard_state(hard_state: &HardState, out: &mut Vec<u8>) {
    let start = frame::begin(out);
    put_u64(out, hard_state.term);
    put_u64(out, hard_state.vote);
    put_u64(out, hard_state.commit);
    frame::end(out, start, HARD_STATE);
}

fn encode_conf_state(at: u64, conf_state: &ConfState, out: &mut Vec<u8>) {
    let start = frame::begin(out);
    put_u64(out, at);
    put_conf_state(conf_state, out);
    frame::end(out, start, CONF_STATE);
}

fn put_conf_state(conf_state: &ConfState, out: &mut Vec<u8>) {
    put_ids(out, &conf_state.voters);
    put_ids(out, &conf_state.learners);
    put_ids(out, &conf_state.voters_outgoing);
    put_ids(out, &conf_state.learners_next);
    out.push(u8::from(conf_state.auto_leave));
}

fn read_conf_state(payload: &mut Reader<'_>) -> Option<ConfState> {
    let mut ids = || {
        let count = payload.u32()?;
        if count > payload.left() / 8 {
            return None;
        }
        (0..count).map(|_| payload.u64()).collect::<Option<Vec<u64>>>()
    };
    let mut conf_state = ConfState {
        voters: ids()?,
        learners: ids()?,
        voters_outgoing: ids()?,
        learners_next: ids()?,
        ..ConfState::default()
    };
    conf_state.auto_leave = match payload.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some(conf_state)
}

fn encode_base((index, term): (u64, u64), out: &mut Vec<u8>) {
    let start = frame::begin(out);
    put_u64(out, index);
    put_u64(out, term);
    frame::end(out, start, BASE);
}

/// The bytes a message carries of `entry`.
fn entry_size(entry: &Entry) -> u64 {
    ENTRY_OVERHEAD_BYTES + (entry.data.len() + entry.context.len()) as u64
}

fn decode(bytes: &[u8]) -> Result<(Item, usize), DecodeError> {
    frame::decode(bytes, read)
}

/// An entry record's fields, its data and context where the record holds them.
struct EntryFields<'a> {
    index: u64,
    term: u64,
    kind: EntryType,
    data: &'a [u8],
    context: &'a [u8],
}

fn entry_fields<'a>(payload: &mut Reader<'a>) -> Option<EntryFields<'a>> {
    let (index, term) = (payload.u64()?, payload.u64()?);
    let kind = match payload.u8()? {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        _ => return None,
    };
    let len = payload.u32()?;
    let data = payload.take(len)?;
    let len = payload.u32()?;
    Some(EntryFields { index, term, kind, data, context: payload.take(len)? })
}

/// An entry record read back whole from `buffer`, its data and context
/// slices of it (not copies).
fn read_entry(kind: u8, payload: &mut Reader<'_>, buffer: &Bytes) -> Option<Entry> {
    if kind != ENTRY {
        return None;
    }
    let fields = entry_fields(payload)?;
    let (data, context) = (buffer.slice_ref(fields.data), buffer.slice_ref(fields.context));
    let mut entry = Entry { index: fields.index, term: fields.term, data, context, ..Entry::default() };
    entry.set_entry_type(fields.kind);
    Some(entry)
}

fn read(kind: u8, payload: &mut Reader<'_>) -> Option<Item> {
    Some(match kind {
        ENTRY => {
            let EntryFields { index, term, data, context, .. } = entry_fields(payload)?;
            Item::Entry { index, term, size: ENTRY_OVERHEAD_BYTES + (data.len() + context.len()) as u64 }
        }
        HARD_STATE => {
            let (term, vote, commit) = (payload.u64()?, payload.u64()?, payload.u64()?);
            Item::HardState(HardState { term, vote, commit, ..HardState::default() })
        }
        CONF_STATE => {
            let at = payload.u64()?;
            Item::ConfState(at, read_conf_state(payload)?)
        }
        BASE => Item::Base { index: payload.u64()?, term: payload.u64()? },
        _ => return None,
    })
}

#[cfg(test)]
mod tests;

//! The durable store: the in-memory `Store`, the write-ahead log in front of
//! it, and the snapshots behind it.
//!
//! A mutation is applied to the store at once (so that later requests of the
//! same tick validate against it) and appended to the log with what is
//! needed to undo it. `commit`, once per tick, syncs the log; only then are
//! the answers sent. If the sync fails, the tick's mutations are undone,
//! their answers become errors, and writes are refused until a restart (a
//! failed fsync cannot be retried safely). Snapshots, and the removal of
//! files they make unused, are in `snapshots`.

mod snapshots;
mod streams;

pub use streams::StreamError;

use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::log;
use crate::snapshot::{self, LoadError, Manifest};
use crate::store::index::Row;
use crate::store::{Filter, Index, Mutation, Store};
use crate::wal::{self, Log, Record, ReplayError};
use roaring::RoaringBitmap;
use snapshots::SnapshotChild;

pub struct Options {
    pub data_dir: PathBuf,
    /// Take a snapshot once the current log segment is this large.
    pub snapshot_log_bytes: u64,
    /// Cut a damaged log at the damage instead of refusing to start.
    pub repair_log: bool,
    /// fdatasync the log at each commit; off only to measure what syncing costs.
    pub sync: bool,
}

/// Why a write could not be made durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageError {
    /// This write's sync failed; it was not applied.
    Failed(SyncFailure),
    /// An earlier sync failed; writes are refused until a restart.
    ReadOnly(SyncFailure),
}

/// A failed sync of the log, kept so that every answer it spoils can say
/// why: the error's kind and text (an `io::Error` cannot be cloned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncFailure {
    pub kind: io::ErrorKind,
    pub message: String,
}

impl From<&io::Error> for SyncFailure {
    fn from(error: &io::Error) -> SyncFailure {
        SyncFailure { kind: error.kind(), message: error.to_string() }
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Failed(failure) => {
                write!(f, "the write could not be made durable: {}", failure.message)
            }
            StorageError::ReadOnly(failure) => write!(
                f,
                "writing the log failed ({}); writes are refused until the server is restarted",
                failure.message
            ),
        }
    }
}

impl std::error::Error for StorageError {}

/// Why the database could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// A directory or file of the data directory could not be made or opened.
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// Another process holds the data directory (its pid, as it wrote it).
    Locked {
        data_dir: PathBuf,
        holder: String,
    },
    Snapshot(LoadError),
    Log(ReplayError),
    /// A cluster node started on a single node's data directory.
    SingleNodeData {
        data_dir: PathBuf,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            OpenError::Locked { data_dir, holder } => write!(
                f,
                "the data directory {} is in use by another quiver process (pid {holder}); one process per data \
                 directory",
                data_dir.display()
            ),
            OpenError::Snapshot(error) => write!(f, "{error}"),
            OpenError::Log(error) => write!(f, "{error}"),
            OpenError::SingleNodeData { data_dir } => write!(
                f,
                "the data directory {} holds a single node's data; a cluster node starts on an empty one (its data \
                 comes from the cluster)",
                data_dir.display()
            ),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::Locked { .. } | OpenError::SingleNodeData { .. } => None,
            OpenError::Snapshot(error) => Some(error),
            OpenError::Log(error) => Some(error),
        }
    }
}

impl From<LoadError> for OpenError {
    fn from(error: LoadError) -> OpenError {
        OpenError::Snapshot(error)
    }
}

impl From<ReplayError> for OpenError {
    fn from(error: ReplayError) -> OpenError {
        OpenError::Log(error)
    }
}

/// An `OpenError::Io` of `action` on `path`.
fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io { action, path: path.to_owned(), source }
}

/// What undoes one applied mutation.
enum Undo {
    Created(String),
    Dropped(String, Box<Index>),
    /// Each id with its previous row, or `None` if it was new.
    Upserted(String, Vec<(i64, Option<Row>)>),
    Deleted(String, Vec<(i64, Row)>),
}

pub struct Database {
    store: Store,
    /// The write-ahead log; none in a cluster, where the Raft log is it
    /// (`open_replicated`).
    log: Option<Log>,
    data_dir: PathBuf,
    wal_dir: PathBuf,
    snapshots_dir: PathBuf,
    manifest: Manifest,
    undo: Vec<Undo>,
    /// The failed sync that made the database refuse writes.
    broken: Option<SyncFailure>,
    child: Option<SnapshotChild>,
    /// The thread removing unused files, if one runs (`remove_unused_files`).
    remover: Option<std::thread::JoinHandle<()>>,
    snapshot_log_bytes: u64,
    /// A cluster's state snapshot finished since the last look: its
    /// cluster bytes (`take_written_state`).
    written_state: Option<Vec<u8>>,
    /// A cluster's: the cluster bytes of the STATE in use (`stored_state`).
    state_cluster: Option<Vec<u8>>,
    /// The children sending snapshot downloads (`stream_index`).
    streams: Vec<libc::pid_t>,
    /// Held for the life of the process: one process per data directory.
    _lock: File,
}

impl Database {
    /// Locks the data directory, loads the snapshots and replays the log.
    ///
    /// Longer than a function should be, for a reason: recovery is one
    /// sequence whose order is its correctness (the lock before any write,
    /// the snapshots before the log, the log's damage handled before it is
    /// appended to), kept in one place to be read top to bottom.
    pub fn open(options: &Options) -> Result<Database, OpenError> {
        let data_dir = options.data_dir.clone();
        let wal_dir = data_dir.join("wal");
        let snapshots_dir = data_dir.join("snapshots");
        // The lock before anything else is written: a second process on
        // this directory stops here.
        fs::create_dir_all(&data_dir).map_err(io_error("create", &data_dir))?;
        let lock = lock(&data_dir)?;
        for dir in [&wal_dir, &snapshots_dir] {
            fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        }

        let started = Instant::now();
        let manifest = snapshot::read_manifest(&data_dir)?.unwrap_or_default();
        let (mut store, vectors) = load_generation(&snapshots_dir, manifest.generation, &manifest.indexes)?;
        log::info(
            "snapshot_loaded",
            format_args!(
                "loaded {} indexes ({vectors} embeddings) from snapshot generation {} in {} ms",
                manifest.indexes.len(),
                manifest.generation,
                started.elapsed().as_millis()
            ),
        );

        let started = Instant::now();
        let mut items = Vec::new();
        let mut skipped = 0u64;
        let from = (manifest.log_start, options.repair_log);
        let replayed = wal::replay(&wal_dir, from, wal::record::decode, |record, _| {
            let applied = match record {
                Record::Restore { name, index } => {
                    store.index(&name).is_none() && {
                        store.put_index(&name, *index.0);
                        true
                    }
                }
                record => replay_one(&mut store, &record, &mut items),
            };
            if !applied {
                skipped += 1;
            }
        })?;
        if let Some((segment, offset, bytes)) = replayed.torn_tail {
            log::warn(
                "log_torn_tail_cut",
                format_args!(
                "recovery: cut a torn record of {bytes} bytes at the end of log segment {segment} (offset {offset}): \
                 an append interrupted by a crash, never acknowledged"
            ),
            );
        }
        if let Some((segment, offset)) = replayed.repaired_at {
            log::warn(
                "log_repaired",
                format_args!(
                "recovery: --repair-log cut the log at segment {segment} offset {offset}; every record after it is gone"
            ),
            );
        }
        log::info(
            "log_replayed",
            format_args!(
                "replayed {} log records ({} bytes, {} segments) in {} ms{}",
                replayed.records,
                replayed.bytes,
                replayed.segments,
                started.elapsed().as_millis(),
                if skipped > 0 { format!(", {skipped} for indexes deleted later") } else { String::new() }
            ),
        );

        let next = replayed.last.map_or(manifest.log_start, |last| last + 1).max(manifest.log_start);
        let mut log_file =
            Log::create(&wal_dir, next).map_err(io_error("start", &wal::segment_path(&wal_dir, next)))?;
        log_file.set_sync(options.sync);
        // Kept while large writes keep coming; `let_go` gives it back.
        log_file.set_keep_bytes(usize::MAX);
        let mut database = Database {
            store,
            log: Some(log_file),
            data_dir,
            wal_dir,
            snapshots_dir,
            manifest,
            undo: Vec::new(),
            broken: None,
            child: None,
            remover: None,
            streams: Vec::new(),
            snapshot_log_bytes: options.snapshot_log_bytes,
            written_state: None,
            state_cluster: None,
            _lock: lock,
        };
        database.remove_unused_files(false);
        Ok(database)
    }

    /// Opens the data directory of a cluster's node: its lock, and the
    /// indexes of its last state snapshot (`STATE`), whose cluster bytes
    /// (where in the Raft log it stands) are returned with it; the node
    /// replays its Raft log from there (entries come to `apply` committed,
    /// so none is logged or undone here). A directory holding a single
    /// node's data is refused: it would be silently left out.
    pub fn open_replicated(data_dir: &Path) -> Result<(Database, Option<Vec<u8>>), OpenError> {
        fs::create_dir_all(data_dir).map_err(io_error("create", data_dir))?;
        let lock = lock(data_dir)?;
        let wal_dir = data_dir.join("wal");
        let single = snapshot::read_manifest(data_dir)?.is_some()
            || wal::segments(&wal_dir).is_ok_and(|segments| !segments.is_empty());
        if single {
            return Err(OpenError::SingleNodeData { data_dir: data_dir.to_owned() });
        }
        let snapshots_dir = data_dir.join("snapshots");
        fs::create_dir_all(&snapshots_dir).map_err(io_error("create", &snapshots_dir))?;
        let state = snapshot::read_state(data_dir)?;
        let mut store = Store::new();
        let mut manifest = Manifest::default();
        if let Some(state) = &state {
            let started = Instant::now();
            store = load_generation(&snapshots_dir, state.generation, &state.indexes)?.0;
            log::info(
                "state_loaded",
                format_args!(
                    "loaded {} indexes from state snapshot generation {} in {} ms",
                    state.indexes.len(),
                    state.generation,
                    started.elapsed().as_millis()
                ),
            );
            manifest = Manifest { generation: state.generation, log_start: 0, indexes: state.indexes.clone() };
        }
        let mut database = Database {
            store,
            log: None,
            data_dir: data_dir.to_owned(),
            wal_dir,
            snapshots_dir,
            manifest,
            undo: Vec::new(),
            broken: None,
            child: None,
            remover: None,
            streams: Vec::new(),
            snapshot_log_bytes: u64::MAX,
            written_state: None,
            state_cluster: state.as_ref().map(|state| state.cluster.clone()),
            _lock: lock,
        };
        database.remove_unused_files(false);
        Ok((database, state.map(|state| state.cluster)))
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The rows of the index `name` that `filter` matches (`Index::matching`):
    /// `None` when it matches every row, or there is no such index. A read,
    /// not a change: it may index metadata keys, which nothing logs.
    pub fn matching(&mut self, name: &str, filter: &Filter) -> Option<RoaringBitmap> {
        self.store.index_mut(name)?.matching(filter)
    }

    /// Indexes the metadata keys `filter` names in index `name`, if it
    /// exists (`Index::index_keys`).
    pub fn index_keys(&mut self, name: &str, filter: &Filter) {
        if let Some(index) = self.store.index_mut(name) {
            index.index_keys(filter);
        }
    }

    /// Gives back the log's buffer of records, if writes grew it, once
    /// they have stopped coming (the caller's judgement).
    pub fn let_go(&mut self) {
        if let Some(log) = &mut self.log {
            log.let_go();
        }
    }

    /// True while mutations wait for `commit`.
    pub fn has_uncommitted(&self) -> bool {
        !self.undo.is_empty()
    }

    /// How many mutations wait for `commit`.
    pub fn uncommitted(&self) -> usize {
        self.undo.len()
    }

    /// Applies a validated mutation and appends it to the log. It is durable
    /// (and may be acknowledged) only after the next successful `commit`.
    pub fn apply(&mut self, mutation: &Mutation<'_>) -> Result<(), StorageError> {
        if let Some(failure) = &self.broken {
            return Err(StorageError::ReadOnly(failure.clone()));
        }
        let Some(log) = &mut self.log else {
            self.apply_committed(mutation);
            return Ok(());
        };
        log.append(mutation);
        let undo = match *mutation {
            Mutation::CreateIndex { name, .. } => {
                self.store.apply(mutation);
                Undo::Created(name.to_owned())
            }
            Mutation::DropIndex { name } => {
                let index = self.store.take_index(name).expect("drop of a validated index");
                Undo::Dropped(name.to_owned(), Box::new(index))
            }
            Mutation::Upsert { index: name, batch, items } => {
                let index = self.store.index(name).expect("upsert into a validated index");
                let previous = items
                    .iter()
                    .map(|&item| {
                        let id = batch.ids[item as usize];
                        (id, index.get(id).map(|(vector, metadata)| (vector.to_vec(), metadata.into())))
                    })
                    .collect();
                self.store.apply(mutation);
                Undo::Upserted(name.to_owned(), previous)
            }
            Mutation::Delete { index: name, ids } => {
                let index = self.store.index_mut(name).expect("delete from a validated index");
                let rows = ids.iter().map(|&id| (id, index.remove(id).expect("delete of a validated id"))).collect();
                Undo::Deleted(name.to_owned(), rows)
            }
        };
        self.undo.push(undo);
        Ok(())
    }

    /// Creates index `name` as `index`, restored from the snapshot image
    /// `image` (`snapshot::load_image`'s, checked row by row by the
    /// caller): one log record, so that it is durable, after the next
    /// `commit`, whole or not at all.
    pub fn restore(&mut self, name: &str, image: &[u8], index: Index) -> Result<(), StorageError> {
        if let Some(failure) = &self.broken {
            return Err(StorageError::ReadOnly(failure.clone()));
        }
        assert!(self.store.index(name).is_none(), "restore over index {name}");
        self.store.put_index(name, index);
        if let Some(log) = &mut self.log {
            log.append_with(|out| wal::record::encode_restore(name, image, out));
            self.undo.push(Undo::Created(name.to_owned()));
        }
        Ok(())
    }

    /// Applies a mutation already durable elsewhere (a committed Raft entry).
    fn apply_committed(&mut self, mutation: &Mutation<'_>) {
        match *mutation {
            Mutation::DropIndex { name } => {
                // Taken whole, freed as one: `Store::apply` would do the same.
                self.store.take_index(name).expect("drop of a validated index");
            }
            _ => self.store.apply(mutation),
        }
    }

    /// Makes this tick's mutations durable with one sync, or undoes them all.
    pub fn commit(&mut self) -> Result<(), StorageError> {
        let Some(log) = &mut self.log else { return Ok(()) };
        if self.undo.is_empty() {
            return Ok(());
        }
        match log.commit() {
            Ok(()) => {
                self.undo.clear();
                Ok(())
            }
            Err(error) => {
                let failure = SyncFailure::from(&error);
                log::error("writes_refused", format_args!("{}", StorageError::ReadOnly(failure.clone())));
                self.rollback();
                self.broken = Some(failure.clone());
                Err(StorageError::Failed(failure))
            }
        }
    }

    fn rollback(&mut self) {
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Created(name) => {
                    self.store.take_index(&name);
                }
                Undo::Dropped(name, index) => {
                    self.store.put_index(&name, *index);
                }
                Undo::Upserted(name, previous) => {
                    let index = self.store.index_mut(&name).expect("undo in an existing index");
                    for (id, before) in previous.into_iter().rev() {
                        match before {
                            Some((vector, metadata)) => index.upsert(id, &vector, &metadata),
                            None => {
                                index.delete(id);
                            }
                        }
                    }
                }
                Undo::Deleted(name, rows) => {
                    let index = self.store.index_mut(&name).expect("undo in an existing index");
                    for (id, (vector, metadata)) in rows.into_iter().rev() {
                        index.upsert(id, &vector, &metadata);
                    }
                }
            }
        }
    }
}

/// Applies one replayed record. Records for an index deleted later (whose
/// snapshot was dropped before the log was) are skipped: returns false.
fn replay_one(store: &mut Store, record: &Record, items: &mut Vec<u32>) -> bool {
    let applies = match record {
        Record::Create { name, .. } => store.index(name).is_none(),
        Record::Drop { name } => store.index(name).is_some(),
        Record::Upsert { name, batch } => {
            store.index(name).is_some_and(|index| (0..batch.len()).all(|i| batch.vector(i).len() == index.dims()))
        }
        Record::Delete { name, .. } => store.index(name).is_some(),
        Record::Restore { .. } => unreachable!("restores are replayed whole, before this"),
    };
    if !applies {
        return false;
    }
    match record {
        Record::Delete { name, ids } => {
            let index = store.index_mut(name).expect("checked above");
            for &id in ids {
                index.delete(id);
            }
        }
        _ => record.with_mutation(items, |mutation| store.apply(&mutation)),
    }
    true
}

/// The indexes `names` of snapshot generation `generation`, and how many
/// rows they hold.
fn load_generation(snapshots_dir: &Path, generation: u64, names: &[String]) -> Result<(Store, usize), LoadError> {
    let paths: Vec<PathBuf> =
        names.iter().map(|name| snapshot::snapshot_path(snapshots_dir, generation, name)).collect();
    let total_bytes = paths.iter().filter_map(|path| fs::metadata(path).ok()).map(|m| m.len()).sum();
    let mut progress = log::Progress::new("loading snapshots", total_bytes);
    let (mut store, mut rows) = (Store::new(), 0);
    for (name, path) in names.iter().zip(&paths) {
        let index = snapshot::load_index(path, &mut progress)?;
        rows += index.len();
        store.put_index(name, index);
    }
    Ok((store, rows))
}

const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the data directory's lock file, or says who holds it.
fn lock(data_dir: &Path) -> Result<File, OpenError> {
    let path = data_dir.join("LOCK");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error("open", &path))?;
    // A snapshot child of a process that just crashed may hold the lock for
    // the moment it takes to die with its parent: wait that long, no more.
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(&path).unwrap_or_default().trim().to_owned();
                return Err(OpenError::Locked { data_dir: data_dir.to_owned(), holder });
            }
            Err(TryLockError::Error(source)) => return Err(OpenError::Io { action: "lock", path, source }),
        }
    }
    let _ = file.set_len(0).and_then(|()| write!(file, "{}", std::process::id())).and_then(|()| file.sync_all());
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(data_dir: &Path) -> Options {
        Options { data_dir: data_dir.to_owned(), snapshot_log_bytes: 1 << 30, repair_log: false, sync: true }
    }

    #[test]
    fn open_errors_say_what_went_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let first = Database::open(&options(dir.path())).unwrap();
        match Database::open(&options(dir.path())) {
            Err(OpenError::Locked { holder, .. }) => assert_eq!(holder, std::process::id().to_string()),
            other => panic!("expected Locked, got {:?}", other.map(|_| ())),
        }
        drop(first);
        fs::write(dir.path().join(snapshot::MANIFEST), b"not a manifest").unwrap();
        assert!(matches!(Database::open(&options(dir.path())), Err(OpenError::Snapshot(LoadError::Damaged { .. }))));
        fs::remove_file(dir.path().join(snapshot::MANIFEST)).unwrap();
        fs::write(wal::segment_path(&dir.path().join("wal"), 0), b"not a log").unwrap();
        fs::write(wal::segment_path(&dir.path().join("wal"), 1), b"").unwrap();
        assert!(matches!(
            Database::open(&options(dir.path())),
            Err(OpenError::Log(ReplayError::NotASegment { path })) if path.ends_with("00000000000000000000.log")
        ));
    }
}

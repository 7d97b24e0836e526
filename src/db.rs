//! The durable store: the in-memory `Store`, the write-ahead log in front of
//! it, and the snapshots behind it.
//!
//! A mutation is applied to the store at once (so that later requests of the
//! same tick validate against it) and appended to the log with what is
//! needed to undo it. `commit`, once per tick, syncs the log; only then are
//! the answers sent. If the sync fails, the tick's mutations are undone,
//! their answers become errors, and writes are refused until a restart (a
//! failed fsync cannot be retried safely).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::files;
use crate::log;
use crate::snapshot::{self, Manifest};
use crate::store::index::Row;
use crate::store::{Index, Mutation, Store};
use crate::wal::{self, Log, Record};

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
    Failed(String),
    /// An earlier sync failed; writes are refused until a restart.
    ReadOnly(String),
}

/// What undoes one applied mutation.
enum Undo {
    Created(String),
    Dropped(String, Index),
    /// Each id with its previous row, or `None` if it was new.
    Upserted(String, Vec<(i64, Option<Row>)>),
    Deleted(String, Vec<(i64, Row)>),
}

struct SnapshotChild {
    pid: libc::pid_t,
    manifest: Manifest,
    started: Instant,
}

pub struct Database {
    store: Store,
    log: Log,
    data_dir: PathBuf,
    wal_dir: PathBuf,
    snapshots_dir: PathBuf,
    manifest: Manifest,
    undo: Vec<Undo>,
    broken: Option<String>,
    child: Option<SnapshotChild>,
    /// The thread removing unused files, if one runs (`remove_unused_files`).
    remover: Option<std::thread::JoinHandle<()>>,
    snapshot_log_bytes: u64,
    /// Held for the life of the process: one process per data directory.
    _lock: File,
}

impl Database {
    /// Locks the data directory, loads the snapshots and replays the log.
    pub fn open(options: &Options) -> Result<Database, String> {
        let data_dir = options.data_dir.clone();
        let wal_dir = data_dir.join("wal");
        let snapshots_dir = data_dir.join("snapshots");
        // The lock before anything else is written: a second process on
        // this directory stops here.
        fs::create_dir_all(&data_dir).map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
        let lock = lock(&data_dir)?;
        for dir in [&wal_dir, &snapshots_dir] {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }

        let started = Instant::now();
        let manifest = snapshot::read_manifest(&data_dir)?.unwrap_or_default();
        let mut store = Store::new();
        let mut vectors = 0usize;
        let paths: Vec<PathBuf> = manifest
            .indexes
            .iter()
            .map(|name| snapshot::snapshot_path(&snapshots_dir, manifest.generation, name))
            .collect();
        let total_bytes = paths.iter().filter_map(|path| fs::metadata(path).ok()).map(|m| m.len()).sum();
        let mut progress = log::Progress::new("loading snapshots", total_bytes);
        for (name, path) in manifest.indexes.iter().zip(&paths) {
            let index = snapshot::load_index(path, &mut progress)?;
            vectors += index.len();
            store.put_index(name, index);
        }
        log::info(format_args!(
            "loaded {} indexes ({vectors} embeddings) from snapshot generation {} in {} ms",
            manifest.indexes.len(),
            manifest.generation,
            started.elapsed().as_millis()
        ));

        let started = Instant::now();
        let mut items = Vec::new();
        let mut skipped = 0u64;
        let replayed = wal::replay(&wal_dir, manifest.log_start, options.repair_log, |record| {
            if !replay_one(&mut store, &record, &mut items) {
                skipped += 1;
            }
        })?;
        if let Some((segment, offset, bytes)) = replayed.torn_tail {
            log::warn(format_args!(
                "recovery: cut a torn record of {bytes} bytes at the end of log segment {segment} (offset {offset}): \
                 an append interrupted by a crash, never acknowledged"
            ));
        }
        if let Some((segment, offset)) = replayed.repaired_at {
            log::warn(format_args!(
                "recovery: --repair-log cut the log at segment {segment} offset {offset}; every record after it is gone"
            ));
        }
        log::info(format_args!(
            "replayed {} log records ({} bytes, {} segments) in {} ms{}",
            replayed.records,
            replayed.bytes,
            replayed.segments,
            started.elapsed().as_millis(),
            if skipped > 0 { format!(", {skipped} for indexes deleted later") } else { String::new() }
        ));

        let segments = wal::segments(&wal_dir).map_err(|e| e.to_string())?;
        let next = segments.last().map_or(manifest.log_start, |&last| last + 1).max(manifest.log_start);
        let mut log_file = Log::create(&wal_dir, next).map_err(|e| format!("cannot start log segment {next}: {e}"))?;
        log_file.set_sync(options.sync);
        let mut database = Database {
            store,
            log: log_file,
            data_dir,
            wal_dir,
            snapshots_dir,
            manifest,
            undo: Vec::new(),
            broken: None,
            child: None,
            remover: None,
            snapshot_log_bytes: options.snapshot_log_bytes,
            _lock: lock,
        };
        database.remove_unused_files(false);
        Ok(database)
    }

    pub fn store(&self) -> &Store {
        &self.store
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
        if let Some(why) = &self.broken {
            return Err(StorageError::ReadOnly(why.clone()));
        }
        self.log.append(mutation);
        let undo = match *mutation {
            Mutation::CreateIndex { name, .. } => {
                self.store.apply(mutation);
                Undo::Created(name.to_owned())
            }
            Mutation::DropIndex { name } => {
                let index = self.store.take_index(name).expect("drop of a validated index");
                Undo::Dropped(name.to_owned(), index)
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

    /// Makes this tick's mutations durable with one sync, or undoes them all.
    pub fn commit(&mut self) -> Result<(), StorageError> {
        if self.undo.is_empty() {
            return Ok(());
        }
        match self.log.commit() {
            Ok(()) => {
                self.undo.clear();
                Ok(())
            }
            Err(error) => {
                let why = format!("writing the log failed ({error}); writes are refused until the server is restarted");
                log::error(format_args!("{why}"));
                self.rollback();
                self.broken = Some(why.clone());
                Err(StorageError::Failed(format!("the write could not be made durable: {error}")))
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
                    self.store.put_index(&name, index);
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

    /// Between ticks: reaps a finished snapshot, starts one when the log has
    /// grown past its limit, and removes the files of deleted indexes.
    pub fn maintain(&mut self) {
        debug_assert!(self.undo.is_empty(), "maintenance with uncommitted mutations");
        self.reap_snapshot(false);
        if self.child.is_some() || self.broken.is_some() {
            return;
        }
        if self.log.segment_bytes() >= self.snapshot_log_bytes {
            self.start_snapshot();
        } else if self.manifest.indexes.iter().any(|name| self.store.index(name).is_none()) {
            self.forget_deleted_indexes();
        }
    }

    /// Forks a child that writes the snapshot from its copy-on-write image
    /// of the store while this process goes on serving.
    fn start_snapshot(&mut self) {
        let rotating = Instant::now();
        let log_start = match self.log.rotate() {
            Ok(segment) => segment,
            Err(error) => {
                log::error(format_args!("cannot start a new log segment for a snapshot: {error}"));
                return;
            }
        };
        let generation = self.manifest.generation + 1;
        let rotated_ms = rotating.elapsed().as_millis();
        // A fork copies only the calling thread: another thread holding a
        // lock (the allocator's, say) at that moment would leave the child
        // stuck on it. The loop's only other threads are a search's scan
        // threads, joined before the search returns, and the file remover,
        // joined here; so the process is single-threaded when it forks.
        self.join_remover();
        let forking = Instant::now();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the process is single-threaded here (above); the child only
        // writes files and leaves with `_exit`, running no destructors of the
        // parent's state.
        match unsafe { libc::fork() } {
            -1 => log::error(format_args!("cannot fork to write a snapshot: {}", io::Error::last_os_error())),
            0 => {
                // The child must not outlive a crashed parent: it holds the
                // data directory's lock and the listening socket.
                // SAFETY: plain syscalls on our own process.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                }
                let result =
                    snapshot::write_all(&self.data_dir, &self.snapshots_dir, generation, log_start, &self.store);
                let code = match result {
                    Ok(manifest) => {
                        // The new manifest is durable: what it supersedes can go,
                        // here, where unlinking large files stalls nobody.
                        for path in unused_files(&self.wal_dir, &self.snapshots_dir, &manifest, None) {
                            let _ = fs::remove_file(path);
                        }
                        let _ = files::sync_dir(&self.snapshots_dir);
                        0
                    }
                    Err(error) => {
                        let _ = writeln!(io::stderr(), "quiver: snapshot generation {generation} failed: {error}");
                        1
                    }
                };
                // SAFETY: ends the child without unwinding into the parent's code.
                unsafe { libc::_exit(code) }
            }
            pid => {
                log::info(format_args!(
                    "snapshot generation {generation} started (log rotated in {rotated_ms} ms, child forked in {} ms)",
                    forking.elapsed().as_millis()
                ));
                let indexes = self.store.names().map(str::to_owned).collect();
                self.child = Some(SnapshotChild {
                    pid,
                    manifest: Manifest { generation, log_start, indexes },
                    started: Instant::now(),
                });
            }
        }
    }

    /// Collects the snapshot child if it is done (or waits for it when `block`).
    fn reap_snapshot(&mut self, block: bool) {
        let Some(child) = &self.child else { return };
        let mut status = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let reaped = unsafe { libc::waitpid(child.pid, &mut status, flags) };
        if reaped == 0 {
            return;
        }
        let child = self.child.take().expect("checked above");
        if reaped == child.pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            log::info(format_args!(
                "snapshot generation {} written in {} ms ({} indexes); log now starts at segment {}",
                child.manifest.generation,
                child.started.elapsed().as_millis(),
                child.manifest.indexes.len(),
                child.manifest.log_start
            ));
            self.manifest = child.manifest;
            self.remove_unused_files(true);
        } else {
            log::error(format_args!(
                "snapshot generation {} failed; the previous one and the log stay in use",
                child.manifest.generation
            ));
            self.remove_unused_files(true);
        }
    }

    /// Rewrites the manifest without indexes deleted since it was written,
    /// and removes their snapshots. Their deletes are durable in the log.
    fn forget_deleted_indexes(&mut self) {
        let mut manifest = self.manifest.clone();
        manifest.indexes.retain(|name| self.store.index(name).is_some());
        match snapshot::write_manifest(&self.data_dir, &manifest) {
            Ok(()) => {
                self.manifest = manifest;
                self.remove_unused_files(true);
            }
            Err(error) => log::error(format_args!("cannot rewrite the manifest: {error}")),
        }
    }

    /// Removes log segments and snapshot files the manifest no longer needs.
    /// Unlinking a large file can take a tenth of a second, so while serving
    /// this happens on a short-lived thread, never in the loop; the thread
    /// is joined before the next one starts and before any fork.
    fn remove_unused_files(&mut self, in_background: bool) {
        self.join_remover();
        let child_generation = self.child.as_ref().map(|c| c.manifest.generation);
        let unused = unused_files(&self.wal_dir, &self.snapshots_dir, &self.manifest, child_generation);
        if unused.is_empty() {
            return;
        }
        let snapshots_dir = self.snapshots_dir.clone();
        let remove = move || {
            for path in unused {
                let _ = fs::remove_file(path);
            }
            let _ = files::sync_dir(&snapshots_dir);
        };
        if in_background {
            self.remover = Some(std::thread::spawn(remove));
        } else {
            remove();
        }
    }

    /// Waits for the file remover, if one is running.
    fn join_remover(&mut self) {
        if let Some(remover) = self.remover.take() {
            // A remover that panicked removed less: the next one retries.
            let _ = remover.join();
        }
    }

    /// At a clean shutdown: a final snapshot, so the next start loads instead of replaying.
    pub fn shutdown(&mut self) {
        if self.child.is_some() {
            self.reap_snapshot(true);
        }
        if self.broken.is_some()
            || (self.log.segment_bytes() <= wal::SEGMENT_HEADER_BYTES as u64
                && self.manifest.log_start == self.log.segment())
        {
            return;
        }
        let started = Instant::now();
        let result = self.log.rotate().and_then(|log_start| {
            snapshot::write_all(
                &self.data_dir,
                &self.snapshots_dir,
                self.manifest.generation + 1,
                log_start,
                &self.store,
            )
        });
        match result {
            Ok(manifest) => {
                self.manifest = manifest;
                self.remove_unused_files(false);
                log::info(format_args!("final snapshot written in {} ms", started.elapsed().as_millis()));
            }
            Err(error) => log::error(format_args!("final snapshot failed ({error}); the log keeps every write")),
        }
    }
}

/// The log segments and snapshot files that `manifest` does not need, sparing
/// those of a snapshot generation still being written.
fn unused_files(wal_dir: &Path, snapshots_dir: &Path, manifest: &Manifest, writing: Option<u64>) -> Vec<PathBuf> {
    let mut unused = Vec::new();
    if let Ok(segments) = wal::segments(wal_dir) {
        unused.extend(segments.into_iter().filter(|&s| s < manifest.log_start).map(|s| wal::segment_path(wal_dir, s)));
    }
    let Ok(entries) = fs::read_dir(snapshots_dir) else { return unused };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let generation = snapshot::generation_of(&name);
        let in_use = generation == Some(manifest.generation)
            && manifest
                .indexes
                .iter()
                .any(|index| snapshot::snapshot_path(snapshots_dir, manifest.generation, index) == entry.path());
        let being_written = generation.is_some() && generation == writing;
        if !in_use && !being_written {
            unused.push(entry.path());
        }
    }
    unused
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

const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the data directory's lock file, or says who holds it.
fn lock(data_dir: &Path) -> Result<File, String> {
    let path = data_dir.join("LOCK");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // A snapshot child of a process that just crashed may hold the lock for
    // the moment it takes to die with its parent: wait that long, no more.
    let deadline = Instant::now() + LOCK_WAIT;
    // SAFETY: flock on a descriptor we own.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        let holder = fs::read_to_string(&path).unwrap_or_default();
        return Err(format!(
            "the data directory {} is in use by another quiver process (pid {}); one process per data directory",
            data_dir.display(),
            holder.trim()
        ));
    }
    let _ = file.set_len(0).and_then(|()| write!(file, "{}", std::process::id())).and_then(|()| file.sync_all());
    Ok(file)
}

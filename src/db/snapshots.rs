//! The database's life behind the log: snapshots written by a forked
//! child while the loop goes on serving, the final snapshot at shutdown,
//! and the removal of files that no snapshot or log position needs.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::Database;
use crate::files;
use crate::log;
use crate::snapshot::{self, Manifest};
use crate::wal;

/// A snapshot being written by a child process.
pub(super) struct SnapshotChild {
    pid: libc::pid_t,
    manifest: Manifest,
    started: Instant,
    /// A cluster's state snapshot: the cluster bytes its STATE holds.
    cluster: Option<Vec<u8>>,
}

impl Database {
    /// Between ticks: reaps a finished snapshot, starts one when the log has
    /// grown past its limit, and removes the files of deleted indexes.
    pub fn maintain(&mut self) {
        debug_assert!(self.undo.is_empty(), "maintenance with uncommitted mutations");
        self.reap_snapshot(false);
        self.reap_streams();
        let Some(log) = &self.log else { return };
        if self.child.is_some() || self.broken.is_some() {
            return;
        }
        if log.segment_bytes() >= self.snapshot_log_bytes {
            self.start_snapshot();
        } else if self.manifest.indexes.iter().any(|name| self.store.index(name).is_none()) {
            self.forget_deleted_indexes();
        }
    }

    /// Forks a child that writes the snapshot from its copy-on-write image
    /// of the store while this process goes on serving.
    fn start_snapshot(&mut self) {
        let rotating = Instant::now();
        let log = self.log.as_mut().expect("a snapshot of the single node's log");
        let log_start = match log.rotate() {
            Ok(segment) => segment,
            Err(error) => {
                log::error("snapshot_failed", format_args!("cannot start a new log segment for a snapshot: {error}"));
                return;
            }
        };
        let generation = self.manifest.generation + 1;
        let rotated_ms = rotating.elapsed().as_millis();
        let indexes = self.store.names().map(str::to_owned).collect();
        self.fork_snapshot(
            Manifest { generation, log_start, indexes },
            None,
            format_args!("log rotated in {rotated_ms} ms"),
        );
    }

    /// Starts a cluster's state snapshot, unless one is being written:
    /// every index as a new generation, and a STATE naming it with
    /// `cluster` (where in the Raft log the store stands now). Once written,
    /// `take_written_state` gives `cluster` back, for the log to be cut.
    pub fn start_state_snapshot(&mut self, cluster: Vec<u8>) -> bool {
        if self.child.is_some() || self.log.is_some() {
            return false;
        }
        let generation = self.manifest.generation + 1;
        let indexes = self.store.names().map(str::to_owned).collect();
        self.fork_snapshot(Manifest { generation, log_start: 0, indexes }, Some(cluster), format_args!("state"));
        self.child.is_some()
    }

    /// Keeps `cluster` as the state of a cluster's node that has none yet
    /// (a group's first member: the empty state, where the group starts).
    pub fn begin_state(&mut self, cluster: Vec<u8>) -> io::Result<()> {
        assert!(self.store.names().next().is_none() && self.log.is_none(), "a state begun once, empty");
        let generation = self.manifest.generation;
        let state = snapshot::State { generation, cluster, indexes: Vec::new() };
        snapshot::write_state(&self.data_dir, &state)?;
        self.state_cluster = Some(state.cluster);
        Ok(())
    }

    /// The cluster bytes of the state snapshot written since the last call.
    pub fn take_written_state(&mut self) -> Option<Vec<u8>> {
        self.written_state.take()
    }

    /// Forks a child that writes `manifest`'s generation from its
    /// copy-on-write image of the store while this process goes on serving:
    /// with a MANIFEST, or a cluster's STATE holding `cluster`.
    fn fork_snapshot(&mut self, manifest: Manifest, cluster: Option<Vec<u8>>, note: std::fmt::Arguments<'_>) {
        let generation = manifest.generation;
        // A fork copies only the calling thread: another thread holding a
        // lock (the allocator's, say) at that moment would leave the child
        // stuck on it. The loop's only other threads are a search's scan
        // threads, joined before the search returns, and the file remover,
        // joined here; so the process is single-threaded when it forks.
        self.join_remover();
        let forking = Instant::now();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // The child writes the indexes' rows, never their codes.
        let rows_only = self.store.rows_for_forks(None);
        // SAFETY: the process is single-threaded here (above); the child only
        // writes files and leaves with `_exit`, running no destructors of the
        // parent's state, and reads of the indexes only their rows, which
        // `rows_only` leaves it.
        let forked = unsafe { libc::fork() };
        if forked != 0 {
            drop(rows_only);
        }
        match forked {
            -1 => log::error(
                "snapshot_failed",
                format_args!("cannot fork to write a snapshot: {}", io::Error::last_os_error()),
            ),
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
                let result = match &cluster {
                    None => snapshot::write_all(
                        &self.data_dir,
                        &self.snapshots_dir,
                        generation,
                        manifest.log_start,
                        &self.store,
                    ),
                    Some(cluster) => write_state_snapshot(self, generation, cluster.clone()),
                };
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
                log::info(
                    "snapshot_started",
                    format_args!(
                        "snapshot generation {generation} started ({note}, child forked in {} ms)",
                        forking.elapsed().as_millis()
                    ),
                );
                self.child = Some(SnapshotChild { pid, manifest, started: Instant::now(), cluster });
            }
        }
    }

    /// Stops a snapshot child, if one runs, and forgets what it wrote.
    fn stop_snapshot(&mut self) {
        let Some(child) = self.child.take() else { return };
        // SAFETY: signals and waits for our own child.
        unsafe {
            libc::kill(child.pid, libc::SIGKILL);
            libc::waitpid(child.pid, std::ptr::null_mut(), 0);
        }
        log::info("snapshot_stopped", format_args!("snapshot generation {} stopped", child.manifest.generation));
    }

    /// The state snapshot in use (a cluster's): its cluster bytes, and
    /// its files by index name, open. A leader sends it to a node too far
    /// behind as an image:
    ///
    /// ```text
    /// count:u32 { name_len:u16 name file_len:u64 file }*count
    /// ```
    ///
    /// A file opened stays whole while it is sent, even once a newer
    /// generation has it removed.
    pub fn stored_state(&self) -> io::Result<(Vec<u8>, files::NamedFiles)> {
        let cluster = self.state_cluster.clone().ok_or_else(|| io::Error::other("this node holds no state yet"))?;
        let (generation, names) = (self.manifest.generation, &self.manifest.indexes);
        let files = names
            .iter()
            .map(|name| Ok((name.clone(), File::open(snapshot::snapshot_path(&self.snapshots_dir, generation, name))?)))
            .collect::<io::Result<_>>()?;
        Ok((cluster, files))
    }

    /// Replaces the state with `image` (`stored_state`'s, the leader's),
    /// durably, with `cluster` in its STATE: the files are written and
    /// checked (each its CRC), then the STATE names them.
    pub fn restore_state(&mut self, cluster: Vec<u8>, image: &[u8]) -> io::Result<()> {
        self.stop_snapshot();
        self.join_remover();
        // Past any generation a stopped child may have begun.
        let generation = self.manifest.generation + 2;
        let files = split_image(image).ok_or_else(|| io::Error::other("the state image sent is not whole"))?;
        // The old store goes first: two whole copies need not fit at once.
        self.store = crate::store::Store::new();
        // The files are written (and synced) on a thread while the indexes
        // are built from the same bytes here: the disk and the CPU at once.
        let started = Instant::now();
        let snapshots_dir = &self.snapshots_dir;
        let mut store = crate::store::Store::new();
        let (written, loaded) = std::thread::scope(|scope| {
            let writer = scope.spawn(|| -> io::Result<u128> {
                for &(name, file) in &files {
                    let path = snapshot::snapshot_path(snapshots_dir, generation, name);
                    files::write_atomically(&path, |out| files::write_uncached(out, file))?;
                }
                files::sync_dir(snapshots_dir)?;
                Ok(started.elapsed().as_millis())
            });
            let mut progress = log::Progress::new("loading the state sent", image.len() as u64);
            let mut load = || -> io::Result<u128> {
                for &(name, file) in &files {
                    let path = snapshot::snapshot_path(snapshots_dir, generation, name);
                    let index = snapshot::load_index_bytes(file, &path, &mut progress).map_err(io::Error::other)?;
                    store.put_index(name, index);
                }
                Ok(started.elapsed().as_millis())
            };
            let loaded = load();
            let written = writer.join().unwrap_or_else(|_| Err(io::Error::other("the state's writer panicked")));
            (written, loaded)
        });
        let (written_ms, loaded_ms) = (written?, loaded?);
        self.store = store;
        let indexes: Vec<String> = files.iter().map(|&(name, _)| name.to_owned()).collect();
        let state = snapshot::State { generation, cluster, indexes: indexes.clone() };
        snapshot::write_state(&self.data_dir, &state)?;
        self.state_cluster = Some(state.cluster);
        log::info(
            "state_received",
            format_args!(
            "state sent written as generation {generation} in {written_ms} ms, and loaded in {loaded_ms} ms meanwhile"
        ),
        );
        self.manifest = Manifest { generation, log_start: 0, indexes };
        self.remove_unused_files(true);
        Ok(())
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
        let exited = reaped == child.pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        // A child that died after its rename (killed, or a failed sync of
        // the directory after it) wrote the generation the data directory
        // now names: it is the one in use, whatever its exit said.
        let named = match &child.cluster {
            None => snapshot::read_manifest(&self.data_dir).ok().flatten().map(|manifest| manifest.generation),
            Some(_) => snapshot::read_state(&self.data_dir).ok().flatten().map(|state| state.generation),
        };
        if exited || named == Some(child.manifest.generation) {
            log::info(
                "snapshot_written",
                format_args!(
                    "snapshot generation {} written in {} ms ({} indexes); log now starts at segment {}",
                    child.manifest.generation,
                    child.started.elapsed().as_millis(),
                    child.manifest.indexes.len(),
                    child.manifest.log_start
                ),
            );
            self.manifest = child.manifest;
            if child.cluster.is_some() {
                self.state_cluster.clone_from(&child.cluster);
            }
            self.written_state = child.cluster;
            self.remove_unused_files(true);
        } else {
            log::error(
                "snapshot_failed",
                format_args!(
                    "snapshot generation {} failed; the previous one and the log stay in use",
                    child.manifest.generation
                ),
            );
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
            Err(error) => log::error("manifest_failed", format_args!("cannot rewrite the manifest: {error}")),
        }
    }

    /// Removes log segments and snapshot files the manifest no longer needs.
    /// Unlinking a large file can take a tenth of a second, so while serving
    /// this happens on a short-lived thread, never in the loop; the thread
    /// is joined before the next one starts and before any fork.
    pub(super) fn remove_unused_files(&mut self, in_background: bool) {
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
    pub(super) fn join_remover(&mut self) {
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
        let Some(log) = &mut self.log else { return };
        if self.broken.is_some()
            || (log.segment_bytes() <= wal::SEGMENT_HEADER_BYTES as u64 && self.manifest.log_start == log.segment())
        {
            return;
        }
        let started = Instant::now();
        let result = log.rotate().and_then(|log_start| {
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
                log::info(
                    "snapshot_written",
                    format_args!("final snapshot written in {} ms", started.elapsed().as_millis()),
                );
            }
            Err(error) => log::error(
                "snapshot_failed",
                format_args!("final snapshot failed ({error}); the log keeps every write"),
            ),
        }
    }
}

/// Writes every index as `generation` and the STATE that names it (in a
/// snapshot child).
fn write_state_snapshot(db: &Database, generation: u64, cluster: Vec<u8>) -> io::Result<Manifest> {
    let indexes = snapshot::write_indexes(&db.snapshots_dir, generation, &db.store)?;
    snapshot::write_state(&db.data_dir, &snapshot::State { generation, cluster, indexes: indexes.clone() })?;
    Ok(Manifest { generation, log_start: 0, indexes })
}

/// An image's files (`stored_state`), by name; none if the bytes are not whole.
fn split_image(mut bytes: &[u8]) -> Option<Vec<(&str, &[u8])>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = bytes.split_at_checked(n)?;
        *bytes = rest;
        Some(head)
    }
    let count = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().ok()?);
    let mut files = Vec::with_capacity((count as usize).min(bytes.len()));
    for _ in 0..count {
        let name_len = u16::from_le_bytes(take(&mut bytes, 2)?.try_into().ok()?);
        let name = std::str::from_utf8(take(&mut bytes, usize::from(name_len))?).ok()?;
        // A name becomes a file name: only what an index's name may be.
        let plain = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if name.is_empty() || name.len() > 255 || !plain {
            return None;
        }
        let file_len = u64::from_le_bytes(take(&mut bytes, 8)?.try_into().ok()?);
        files.push((name, take(&mut bytes, usize::try_from(file_len).ok()?)?));
    }
    bytes.is_empty().then_some(files)
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

//! The write-ahead log: every mutation is recorded here, and synced, before
//! its answer leaves.
//!
//! The log is a sequence of segment files `wal/<seq>.log`, each a 16-byte
//! header (`QUIVWAL1`, version u32, zero u32) followed by records (see
//! `record.rs`). Records are appended to a buffer as requests are handled;
//! once per tick of the event loop `commit` writes the buffer and calls
//! `fdatasync` once for all of them (group commit). A snapshot starts a new
//! segment, and drops the segments it covers once it is safely on disk.

pub mod frame;
pub mod record;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::files::{forget_cached, page_bytes, sync_dir};
use crate::limits::LOG_CACHE_DROP_BYTES;
use crate::store::Mutation;
pub use frame::DecodeError;
pub use record::Record;

pub const SEGMENT_MAGIC: &[u8; 8] = b"QUIVWAL1";
pub const SEGMENT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_BYTES: usize = 16;

pub fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.log"))
}

/// Where a record is: its segment, and its offset and length there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
}

/// The segment numbers in `dir`, ascending.
pub fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name.strip_suffix(".log").and_then(|stem| stem.parse::<u64>().ok()) {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Faults on demand, so tests can reach what a disk rarely does. Only
/// debug builds read them:
///
/// - `QUIVER_FAULT_SYNC_FAIL_AFTER=N`: the syncs after the first N fail.
/// - `QUIVER_FAULT_POWER_LOSS=1`: a `kill -9` loses what a power loss
///   would. After each sync the segment's synced length is noted beside it
///   (`<segment>.synced`); replay first cuts every segment back to it, so
///   bytes written but not yet synced are gone; and a commit waits a moment
///   between its write and its sync, so that kills land there.
#[derive(Debug, Default)]
struct Fault {
    sync_fail_after: Option<u64>,
    syncs: u64,
    power_loss: bool,
}

/// Whether the power-loss seam is on (see `Fault`).
fn power_loss_seam() -> bool {
    cfg!(debug_assertions) && std::env::var_os("QUIVER_FAULT_POWER_LOSS").is_some_and(|v| v == "1")
}

/// Where the power-loss seam notes how much of `segment` is synced.
fn synced_note_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.synced"))
}

/// Under the power-loss seam: notes that `bytes` of `segment` are synced.
fn note_synced(dir: &Path, segment: u64, bytes: u64) {
    // Only a kill is emulated, and a kill keeps what was written.
    let _ = fs::write(synced_note_path(dir, segment), bytes.to_le_bytes());
}

/// Under the power-loss seam: cuts every segment of `dir` back to what was
/// synced, as a power loss would have.
fn drop_unsynced(dir: &Path) -> io::Result<()> {
    for segment in segments(dir)? {
        let Ok(note) = fs::read(synced_note_path(dir, segment)) else { continue };
        let Ok(bytes) = <[u8; 8]>::try_from(note.as_slice()) else { continue };
        let synced = u64::from_le_bytes(bytes);
        let file = OpenOptions::new().write(true).open(segment_path(dir, segment))?;
        if file.metadata()?.len() > synced {
            crate::log::warn(
                "power_loss_simulated",
                format_args!(
                "QUIVER_FAULT_POWER_LOSS: segment {segment} cut to its {synced} synced bytes, as a power loss would"
            ),
            );
            file.set_len(synced)?;
        }
    }
    Ok(())
}

impl Fault {
    fn from_env() -> Fault {
        let sync_fail_after = if cfg!(debug_assertions) {
            std::env::var("QUIVER_FAULT_SYNC_FAIL_AFTER").ok().and_then(|n| n.parse().ok())
        } else {
            None
        };
        Fault { sync_fail_after, syncs: 0, power_loss: power_loss_seam() }
    }

    fn check(&mut self) -> io::Result<()> {
        self.syncs += 1;
        match self.sync_fail_after {
            Some(after) if self.syncs > after => Err(io::Error::other("injected sync failure")),
            _ => Ok(()),
        }
    }
}

/// The open segment being appended to.
pub struct Log {
    dir: PathBuf,
    file: File,
    segment: u64,
    /// Bytes of the segment known to be on disk.
    synced_bytes: u64,
    /// Bytes of the segment dropped from the page cache (all synced).
    uncached_bytes: u64,
    /// Records appended since the last commit.
    pending: Vec<u8>,
    fault: Fault,
    sync: bool,
    /// `pending`'s capacity kept once synced (`set_keep_bytes`).
    keep_bytes_max: usize,
}

impl Log {
    /// Starts segment `segment` in `dir` (which must not exist yet).
    pub fn create(dir: &Path, segment: u64) -> io::Result<Log> {
        let file = new_segment(dir, segment)?;
        Ok(Log::appending(dir, file, segment, SEGMENT_HEADER_BYTES as u64))
    }

    /// Appends to segment `segment` of `dir`, whole and synced at `len`
    /// bytes (one written in full and renamed into place).
    pub fn resume(dir: &Path, segment: u64, len: u64) -> io::Result<Log> {
        let file = OpenOptions::new().append(true).open(segment_path(dir, segment))?;
        Ok(Log::appending(dir, file, segment, len))
    }

    /// A log appending to `file`, segment `segment` of `dir`, whose first
    /// `synced_bytes` are on disk.
    fn appending(dir: &Path, file: File, segment: u64, synced_bytes: u64) -> Log {
        let fault = Fault::from_env();
        if fault.power_loss {
            note_synced(dir, segment, synced_bytes);
        }
        let keep_bytes_max = crate::limits::BUF_KEEP_BYTES_MAX;
        Log {
            dir: dir.to_owned(),
            file,
            segment,
            synced_bytes,
            uncached_bytes: 0,
            pending: Vec::new(),
            fault,
            sync: true,
            keep_bytes_max,
        }
    }

    /// How much of the buffer of records awaiting their sync is kept once
    /// they are synced (`limits::BUF_KEEP_BYTES_MAX` unless set): a log
    /// that takes large records steadily (a cluster's, each entry a whole
    /// batch) keeps more, rather than fault in fresh memory for each.
    pub fn set_keep_bytes(&mut self, bytes: usize) {
        self.keep_bytes_max = bytes;
    }

    /// Gives back the buffer of records awaiting their sync if it is empty
    /// and grew past `limits::BUF_KEEP_BYTES_MAX`: for an owner that keeps
    /// it between commits (`set_keep_bytes`) while large writes come.
    pub fn let_go(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > crate::limits::BUF_KEEP_BYTES_MAX {
            self.pending = Vec::new();
        }
    }

    /// Whether `commit` calls fdatasync (off only to measure its cost).
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    pub fn segment(&self) -> u64 {
        self.segment
    }

    pub fn segment_bytes(&self) -> u64 {
        self.synced_bytes
    }

    /// Where in the segment the next record appended will start: after
    /// what is synced and what awaits the next commit.
    pub fn end(&self) -> u64 {
        self.synced_bytes + self.pending.len() as u64
    }

    pub fn append(&mut self, mutation: &Mutation<'_>) {
        record::encode(mutation, &mut self.pending);
    }

    /// Appends the records `encode` writes (framed by `frame`), to be
    /// synced by the next `commit`.
    pub fn append_with(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        encode(&mut self.pending);
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes what was appended and syncs it: one `fdatasync` for all of it.
    /// On failure the segment is cut back to what was synced before, as far
    /// as the disk still allows, and the appended records are dropped.
    pub fn commit(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self.fault.check().and_then(|()| {
            self.file.write_all(&self.pending)?;
            if self.fault.power_loss {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if self.sync {
                self.file.sync_data()?;
            }
            Ok(())
        });
        match result {
            Ok(()) => {
                self.synced_bytes += self.pending.len() as u64;
                let whole_pages = self.synced_bytes & !(page_bytes() - 1);
                if self.sync && whole_pages >= self.uncached_bytes + LOG_CACHE_DROP_BYTES {
                    self.forget_synced(whole_pages);
                }
                if self.fault.power_loss {
                    note_synced(&self.dir, self.segment, self.synced_bytes);
                }
                self.pending.clear();
                if self.pending.capacity() > self.keep_bytes_max {
                    self.pending = Vec::new();
                }
                Ok(())
            }
            Err(error) => {
                self.pending.clear();
                let _ = self.file.set_len(self.synced_bytes).and_then(|()| self.file.sync_all());
                Err(error)
            }
        }
    }

    /// Lets the kernel drop the segment's synced bytes up to `end` from its
    /// page cache: a log is read back only at a start. In a megabyte at a
    /// time (`LOG_CACHE_DROP_BYTES`), and never the page the next records
    /// go on, which would then be read back from the disk to be added to.
    fn forget_synced(&mut self, end: u64) {
        if end > self.uncached_bytes {
            forget_cached(&self.file, self.uncached_bytes, end - self.uncached_bytes);
            self.uncached_bytes = end;
        }
    }

    /// Closes the current segment and starts the next; returns its number.
    /// Nothing may be pending.
    pub fn rotate(&mut self) -> io::Result<u64> {
        assert!(self.pending.is_empty(), "rotate with uncommitted records");
        let next = self.segment + 1;
        let file = new_segment(&self.dir, next)?;
        if self.sync {
            self.forget_synced(self.synced_bytes);
        }
        self.file = file;
        self.segment = next;
        self.synced_bytes = SEGMENT_HEADER_BYTES as u64;
        self.uncached_bytes = 0;
        if self.fault.power_loss {
            note_synced(&self.dir, next, self.synced_bytes);
        }
        Ok(next)
    }
}

/// The bytes a segment starts with.
pub fn segment_header() -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[..8].copy_from_slice(SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    header
}

fn new_segment(dir: &Path, segment: u64) -> io::Result<File> {
    let path = segment_path(dir, segment);
    let mut file = OpenOptions::new().write(true).create_new(true).open(&path)?;
    file.write_all(&segment_header())?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// How a scan of a segment's records ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// Every byte was a whole, valid record.
    Clean,
    /// A record cut short, or only zeros, from `offset` on: a torn append.
    Torn { offset: usize },
    /// A damaged record at `offset`.
    Damaged { offset: usize, error: DecodeError },
}

/// Decodes the records of `bytes` (a segment without its header) in order
/// with `decode`, handing each to `apply`, until the bytes end or stop
/// being records.
pub fn scan<R>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<(R, usize), DecodeError>,
    mut apply: impl FnMut(R, usize),
) -> ScanEnd {
    let mut at = 0;
    while at < bytes.len() {
        match decode(&bytes[at..]) {
            Ok((record, len)) => {
                apply(record, len);
                at += len;
            }
            Err(DecodeError::Truncated) => return ScanEnd::Torn { offset: at },
            Err(_) if bytes[at..].iter().all(|&b| b == 0) => return ScanEnd::Torn { offset: at },
            Err(error) => return ScanEnd::Damaged { offset: at, error },
        }
    }
    ScanEnd::Clean
}

/// Why the log could not be read back at start-up.
#[derive(Debug)]
pub enum ReplayError {
    /// A file of the log could not be listed, read, cut or removed.
    Io { action: &'static str, path: PathBuf, source: io::Error },
    /// A file named as a segment that does not start as one.
    NotASegment { path: PathBuf },
    /// A record damaged before the end of the log (and no `--repair-log`).
    Damaged { path: PathBuf, offset: usize, why: String },
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            ReplayError::NotASegment { path } => write!(f, "{} is not a quiver log segment", path.display()),
            ReplayError::Damaged { path, offset, why } => write!(
                f,
                "the log is damaged: {} at offset {offset}: {why}; start with --repair-log to cut the log there, \
                 dropping every record after it",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// An `Io` error of `action` on `path`.
fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ReplayError + 'a {
    move |source| ReplayError::Io { action, path: path.to_owned(), source }
}

/// What reading the log found, for the start-up log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub segments: usize,
    /// The last segment left in the log, if any: the next one follows it.
    pub last: Option<u64>,
    pub records: u64,
    pub bytes: u64,
    /// `(segment, offset, bytes)` of a torn final record that was cut off.
    pub torn_tail: Option<(u64, u64, u64)>,
    /// `(segment, offset)` where `--repair-log` cut the log.
    pub repaired_at: Option<(u64, u64)>,
}

/// Reads segments `from..` of `dir` in order, handing each record (as
/// `decode` reads it) and its place to `apply`.
///
/// A torn record at the very end of the last segment (a crash mid-append) is
/// cut off. Damage anywhere else stops recovery with an error naming the file
/// and offset, unless `repair` is set: then the log is cut at the damage and
/// everything after it is dropped.
pub fn replay<R>(
    dir: &Path,
    (from, repair): (u64, bool),
    decode: impl Fn(&[u8]) -> Result<(R, usize), DecodeError>,
    mut apply: impl FnMut(R, Place),
) -> Result<Replayed, ReplayError> {
    if power_loss_seam() {
        drop_unsynced(dir).map_err(io_error("cut to what was synced", dir))?;
    }
    let all = segments(dir).map_err(io_error("list", dir))?;
    let wanted: Vec<u64> = all.into_iter().filter(|&s| s >= from).collect();
    let mut report = Replayed { segments: wanted.len(), last: wanted.last().copied(), ..Replayed::default() };
    let total_bytes: u64 =
        wanted.iter().filter_map(|&s| fs::metadata(segment_path(dir, s)).ok()).map(|m| m.len()).sum();
    let mut progress = crate::log::Progress::new("replaying the log", total_bytes);
    for (n, &segment) in wanted.iter().enumerate() {
        let path = segment_path(dir, segment);
        let bytes = fs::read(&path).map_err(io_error("read", &path))?;
        let last = n + 1 == wanted.len();
        if bytes.len() < SEGMENT_HEADER_BYTES || &bytes[..8] != SEGMENT_MAGIC {
            if last && bytes.iter().all(|&b| b == 0) {
                // Created, but its header never reached the disk: removed,
                // or once a segment follows it it would read as damage.
                fs::remove_file(&path).map_err(io_error("remove", &path))?;
                sync_dir(dir).map_err(io_error("sync", dir))?;
                report.torn_tail = Some((segment, 0, bytes.len() as u64));
                continue;
            }
            return Err(ReplayError::NotASegment { path });
        }
        let mut offset = SEGMENT_HEADER_BYTES as u64;
        let end = scan(&bytes[SEGMENT_HEADER_BYTES..], &decode, |record, len| {
            apply(record, Place { segment, offset, len: len as u64 });
            offset += len as u64;
            report.records += 1;
            progress.advance(len as u64);
        });
        let (at, error) = match end {
            ScanEnd::Clean => {
                report.bytes += bytes.len() as u64;
                continue;
            }
            ScanEnd::Torn { offset } if last => {
                let at = SEGMENT_HEADER_BYTES + offset;
                cut(&path, at as u64)?;
                report.torn_tail = Some((segment, at as u64, (bytes.len() - at) as u64));
                report.bytes += at as u64;
                continue;
            }
            ScanEnd::Torn { offset } => {
                (SEGMENT_HEADER_BYTES + offset, "record cut short before the last segment".to_owned())
            }
            ScanEnd::Damaged { offset, error } => (SEGMENT_HEADER_BYTES + offset, error.to_string()),
        };
        if !repair {
            return Err(ReplayError::Damaged { path, offset: at, why: error });
        }
        cut(&path, at as u64)?;
        for &later in &wanted[n + 1..] {
            let later = segment_path(dir, later);
            fs::remove_file(&later).map_err(io_error("remove", &later))?;
        }
        report.repaired_at = Some((segment, at as u64));
        report.last = Some(segment);
        report.bytes += at as u64;
        return Ok(report);
    }
    Ok(report)
}

fn cut(path: &Path, len: u64) -> Result<(), ReplayError> {
    let file = OpenOptions::new().write(true).open(path).map_err(io_error("open", path))?;
    file.set_len(len).and_then(|()| file.sync_all()).map_err(io_error("cut", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crash between creating a segment and syncing its header leaves
    /// zeros, or nothing: that start and every later one go on.
    #[test]
    fn a_segment_whose_header_never_reached_the_disk_stops_no_start() {
        for torn in [&[][..], &[0u8; 9][..]] {
            let dir = tempfile::tempdir().unwrap();
            let mut log = Log::create(dir.path(), 0).unwrap();
            log.append(&Mutation::DropIndex { name: "abc" });
            log.commit().unwrap();
            fs::write(segment_path(dir.path(), 1), torn).unwrap();
            for start in 0..2 {
                let mut records = 0;
                let replayed = replay(dir.path(), (0, false), record::decode, |_, _| records += 1).unwrap();
                assert_eq!(records, 1, "start {start}");
                // Each start begins a segment after the last.
                Log::create(dir.path(), replayed.last.unwrap() + 1).unwrap();
            }
        }
    }

    /// Synced records leave the page cache a megabyte at a time, all but
    /// the page the next ones go on; a rotation lets the rest go.
    #[test]
    fn the_synced_log_leaves_the_page_cache_in_megabytes() {
        let Some(dir) = crate::files::dir_that_drops_pages("the synced log leaves the page cache") else { return };
        let path = segment_path(dir.path(), 0);
        let mut log = Log::create(dir.path(), 0).unwrap();
        let record = vec![7u8; 30_000];
        let mut dropped_at = Vec::new();
        while log.end() < 3 << 20 {
            log.append_with(|out| out.extend_from_slice(&record));
            let before = log.uncached_bytes;
            log.commit().unwrap();
            if log.uncached_bytes != before {
                dropped_at.push(log.uncached_bytes);
            }
        }
        // Drops of a megabyte or a little more each, in whole pages.
        assert!(dropped_at.len() >= 2, "{dropped_at:?}");
        for (i, &at) in dropped_at.iter().enumerate() {
            let from = if i == 0 { 0 } else { dropped_at[i - 1] };
            assert!(at - from >= LOG_CACHE_DROP_BYTES && at - from < LOG_CACHE_DROP_BYTES + 30_000, "{dropped_at:?}");
            assert_eq!(at % page_bytes(), 0);
        }
        let cached = crate::files::cached_pages(&path);
        let kept = (log.uncached_bytes / page_bytes()) as usize;
        assert!(cached[..kept].iter().all(|&c| !c), "a dropped page is still cached");
        assert!(cached[kept..].iter().all(|&c| c), "a page not yet dropped is gone");
        log.rotate().unwrap();
        let cached = crate::files::cached_pages(&path);
        assert!(cached[..cached.len() - 1].iter().all(|&c| !c), "a rotation kept pages of the old segment");
    }
}

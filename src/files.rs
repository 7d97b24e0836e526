//! Writing files so that they survive a crash: whole or not at all, with
//! their directory entries on disk.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Writes `path` whole or not at all: `fill` writes a new `path.tmp`, which
/// is synced and renamed over `path`. The rename is durable only once the
/// directory is synced (`sync_dir`): once for every file of one step.
pub fn write_atomically(path: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp)?;
    fill(&mut file)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

/// fsync a directory, so that a file created, renamed or removed in it stays
/// so after power loss.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Files open, each by its name (a state's, one per index).
pub type NamedFiles = Vec<(String, File)>;

/// Lets the kernel drop `len` bytes of `file` from `offset` from its page
/// cache, once they are synced, or read and done with: a log is read back
/// rarely (at a start, or for a node far behind), and pages dropped at
/// once are the ones the next writes and reads reuse, still in the CPU's
/// caches, where fresh pages cost a fault each (many times the copy on a
/// virtual machine). Only advice: an error changes nothing that was
/// written.
pub fn forget_cached(file: &File, offset: u64, len: u64) {
    advise(file, offset, len, libc::POSIX_FADV_DONTNEED);
}

/// `forget_cached` for the pages wholly inside `len` bytes from `offset`.
/// The kernel keeps a page also holding bytes outside them, but for the
/// file's last page, which it drops when the range ends at the file's end:
/// that is the page a log's next records go on, which would then be read
/// back from the disk to be added to. A range without a whole page costs
/// no call.
pub fn forget_whole_pages(file: &File, offset: u64, len: u64) {
    let page = page_bytes();
    let (first, end) = (offset.next_multiple_of(page), (offset + len) & !(page - 1));
    if end > first {
        forget_cached(file, first, end - first);
    }
}

/// The page cache's page size.
pub fn page_bytes() -> u64 {
    // SAFETY: sysconf reads a value the C library holds; no memory of ours.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).ok().filter(|b| b.is_power_of_two()).unwrap_or(4096)
}

/// Which of `path`'s pages are in the page cache (for tests).
#[cfg(test)]
pub fn cached_pages(path: &std::path::Path) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a read-only mapping of a file nothing cuts while it is
    // mapped; mincore writes one byte a page into `pages`, which has
    // room for every page of it; the mapping is undone before return.
    unsafe {
        let page = page_bytes() as usize;
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        let mut pages = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(map, len, pages.as_mut_ptr()), 0);
        libc::munmap(map, len);
        pages.iter().map(|&p| p & 1 == 1).collect()
    }
}

/// A directory for `test` on the project's disk (`/tmp` may be a tmpfs,
/// whose pages stay) whose filesystem drops the pages it is advised to,
/// as a probe shows first. Where it keeps them (ZFS, tmpfs): none, and a
/// skip recorded.
#[cfg(test)]
pub fn dir_that_drops_pages(test: &str) -> Option<tempfile::TempDir> {
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap();
    let dir = tempfile::tempdir_in(target).unwrap();
    let probe = dir.path().join("probe");
    let file = std::fs::File::create(&probe).unwrap();
    std::io::Write::write_all(&mut &file, &vec![1u8; 1 << 20]).unwrap();
    file.sync_data().unwrap();
    forget_cached(&file, 0, 1 << 20);
    if cached_pages(&probe).iter().all(|&c| c) {
        crate::testing::skip(test, "this filesystem keeps pages it is advised to drop");
        return None;
    }
    Some(dir)
}

/// `posix_fadvise`: only advice, whose failure changes nothing written or read.
fn advise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: a plain system call on a descriptor `file` keeps open; it
    // reads and writes no memory of ours.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) };
}

/// Bytes `Uncached` writes, syncs and drops from the page cache at a time.
const UNCACHED_CHUNK_BYTES: u64 = 8 << 20;

/// A writer to a new file that does not keep what it writes in the page
/// cache: for data read from the file only at the next start, or sent
/// from it once. Every `UNCACHED_CHUNK_BYTES` it syncs what it wrote and
/// drops those pages, so the same few pages of cache take all of it;
/// fresh pages for each would cost a fault apiece, many times the copy on
/// a virtual machine. `flush` syncs and drops the rest.
pub struct Uncached<'a> {
    file: &'a mut File,
    /// Bytes written; those before `synced` are synced and dropped.
    written: u64,
    synced: u64,
}

impl<'a> Uncached<'a> {
    /// Writes `file` (new, empty) from its start.
    pub fn new(file: &'a mut File) -> Uncached<'a> {
        Uncached { file, written: 0, synced: 0 }
    }

    fn sync_and_drop(&mut self) -> io::Result<()> {
        if self.written > self.synced {
            self.file.sync_data()?;
            forget_cached(self.file, self.synced, self.written - self.synced);
            self.synced = self.written;
        }
        Ok(())
    }
}

impl io::Write for Uncached<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = UNCACHED_CHUNK_BYTES - (self.written - self.synced);
        let written = self.file.write(&bytes[..bytes.len().min(room as usize)])?;
        self.written += written as u64;
        if self.written - self.synced >= UNCACHED_CHUNK_BYTES {
            self.sync_and_drop()?;
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sync_and_drop()
    }
}

/// Writes `bytes` to `file` (a new one), synced, without keeping them in
/// the page cache (`Uncached`): for data the process holds in memory
/// anyway (a state it was sent), read from the file only at the next start.
pub fn write_uncached(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut out = Uncached::new(file);
    out.write_all(bytes)?;
    out.flush()
}

/// Bytes of a file being sent that are asked of the disk ahead of the
/// socket (`Sending`).
const READ_AHEAD_BYTES: u64 = 16 << 20;

/// A file being sent over a socket, from its start to its length when it
/// was opened: from the page cache (sendfile: no copy through our memory),
/// the disk asked for `READ_AHEAD_BYTES` ahead of what is sent, and the
/// pages more than that behind it dropped (the socket no longer holds
/// them). State files are written uncached (`Uncached`) and sent rarely:
/// the same few pages of cache carry all of one, and sending it again
/// reads it from disk again.
pub struct Sending {
    file: File,
    /// Invariant `dropped <= offset <= end`: bytes dropped from the cache,
    /// bytes sent, the length to send. `ahead`: bytes asked of the disk
    /// (the socket may take more at once).
    dropped: u64,
    offset: u64,
    end: u64,
    ahead: u64,
}

impl Sending {
    pub fn new(file: File) -> io::Result<Sending> {
        let end = file.metadata()?.len();
        Ok(Sending { file, dropped: 0, offset: 0, end, ahead: 0 })
    }

    /// Bytes left to send.
    pub fn left(&self) -> u64 {
        self.end - self.offset
    }

    /// Sends what `socket` takes; 0 only where the file ends before the
    /// length it had.
    pub fn send(&mut self, socket: &impl AsRawFd) -> io::Result<usize> {
        self.ahead = self.ahead.max(self.offset);
        if self.ahead < self.end && self.ahead - self.offset < READ_AHEAD_BYTES / 2 {
            let len = READ_AHEAD_BYTES.min(self.end - self.ahead);
            advise(&self.file, self.ahead, len, libc::POSIX_FADV_WILLNEED);
            self.ahead += len;
        }
        let sent = send_file(socket, &self.file, &mut self.offset, self.end)?;
        let behind = if self.offset == self.end { self.end } else { self.offset.saturating_sub(READ_AHEAD_BYTES) };
        if behind >= self.dropped + READ_AHEAD_BYTES / 2 || (behind == self.end && behind > self.dropped) {
            forget_cached(&self.file, self.dropped, behind - self.dropped);
            self.dropped = behind;
        }
        Ok(sent)
    }
}

/// Sends what `socket` takes of `file` from `*offset` up to `end`, and
/// moves `offset` past it. 0 only where the file ends before `end`.
fn send_file(socket: &impl AsRawFd, file: &File, offset: &mut u64, end: u64) -> io::Result<usize> {
    // Linux sends at most about 2 GiB a call.
    let count = usize::try_from(end.saturating_sub(*offset)).unwrap_or(usize::MAX).min(1 << 30);
    let mut at = libc::off_t::try_from(*offset).map_err(|_| io::Error::other("a file offset past off_t"))?;
    // SAFETY: a system call on two descriptors their owners keep open,
    // writing only `at`, a valid off_t of ours.
    let sent = unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), &mut at, count) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    *offset = at as u64;
    Ok(sent as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_failed_fill_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.txt");
        write_atomically(&path, |file| file.write_all(b"one")).unwrap();
        let failed = write_atomically(&path, |file| {
            file.write_all(b"tw")?;
            Err(io::Error::other("disk full"))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&path).unwrap(), b"one");
        write_atomically(&path, |file| file.write_all(b"two")).unwrap();
        sync_dir(dir.path()).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
    }

    /// 20 MB and a little, in writes of many sizes: what reads back is
    /// what was written, whatever the chunks' edges.
    fn pattern() -> Vec<u8> {
        (0..(20u32 << 20) + 12_345).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect()
    }

    #[test]
    fn what_is_written_uncached_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern();
        let path = dir.path().join("pieces");
        write_atomically(&path, |file| {
            let mut out = Uncached::new(file);
            let mut at = 0;
            for size in [1usize, 4095, 8 << 20, 3, (5 << 20) + 1].iter().cycle() {
                let end = (at + size).min(bytes.len());
                out.write_all(&bytes[at..end])?;
                at = end;
                if at == bytes.len() {
                    break;
                }
            }
            out.flush()
        })
        .unwrap();
        assert!(fs::read(&path).unwrap() == bytes, "written in pieces");
        let path = dir.path().join("whole");
        write_atomically(&path, |file| write_uncached(file, &bytes)).unwrap();
        assert!(fs::read(&path).unwrap() == bytes, "written at once");
    }

    #[test]
    fn a_file_sent_arrives_whole() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern();
        let path = dir.path().join("sent");
        write_atomically(&path, |file| write_uncached(file, &bytes)).unwrap();
        let (mut socket, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let mut received = Vec::new();
            peer.read_to_end(&mut received).map(|_| received)
        });
        let mut sending = Sending::new(File::open(&path).unwrap()).unwrap();
        while sending.left() > 0 {
            assert!(sending.send(&socket).unwrap() > 0);
        }
        socket.flush().unwrap();
        drop(socket);
        assert!(reader.join().unwrap().unwrap() == bytes);
    }
}

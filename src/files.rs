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
/// cache, once they are synced: a log is read back only when the server
/// starts, and pages dropped at once are the ones its next writes reuse,
/// still in the CPU's caches, where fresh pages cost a fault each (many
/// times the copy on a virtual machine). Only advice: an error changes
/// nothing that was written.
pub fn forget_cached(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: a plain system call on a descriptor `file` keeps open; it
    // reads and writes no memory of ours.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
}

/// Bytes `write_uncached` writes, syncs and drops from the page cache at a time.
const UNCACHED_CHUNK_BYTES: usize = 8 << 20;

/// Writes `bytes` at the end of `file` (a new one), synced, without
/// keeping them in the page cache: for data the process holds in memory
/// anyway (a state it was sent), read from the file only at the next
/// start. Each chunk is synced and dropped before the next is written, so
/// the same few pages of cache take all of it.
pub fn write_uncached(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut offset = 0u64;
    for chunk in bytes.chunks(UNCACHED_CHUNK_BYTES) {
        file.write_all(chunk)?;
        file.sync_data()?;
        forget_cached(file, offset, chunk.len() as u64);
        offset += chunk.len() as u64;
    }
    Ok(())
}

/// Sends what `socket` takes of `file` from `*offset` up to `end`, from
/// the page cache (sendfile: no copy through our memory), and moves
/// `offset` past it. 0 only where the file ends before `end`.
pub fn send_file(socket: &impl AsRawFd, file: &File, offset: &mut u64, end: u64) -> io::Result<usize> {
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
}

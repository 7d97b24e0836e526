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

//! Writing files so that they survive a crash: whole or not at all, with
//! their directory entries on disk.

use std::fs::{self, File};
use std::io;
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

//! Backups while serving: one index's snapshot image sent to a client by a
//! forked child, from its copy-on-write image of the store, while this
//! process goes on serving and writing. What the child sends is the index
//! as of the fork, whole: the writes that follow change the parent's pages,
//! not the child's.

use std::io::{self, BufWriter, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};

use super::Database;
use crate::limits::{SNAPSHOT_DOWNLOADS_MAX, SNAPSHOT_SEND_STALL_MS};
use crate::snapshot;

/// Why a download could not start.
#[derive(Debug)]
pub enum StreamError {
    /// `SNAPSHOT_DOWNLOADS_MAX` are being sent.
    Busy,
    /// The fork failed.
    Fork(io::Error),
}

impl Database {
    /// Forks a child that writes `prefix` (the replies the connection owes,
    /// then this answer's head), then index `name`'s snapshot image, to the
    /// socket `fd`, and ends. The caller lets go of the socket without
    /// shutting it down: it is the child's now.
    pub fn stream_index(&mut self, name: &str, prefix: &[u8], fd: RawFd) -> Result<(), StreamError> {
        self.reap_streams();
        if self.streams.len() >= SNAPSHOT_DOWNLOADS_MAX {
            return Err(StreamError::Busy);
        }
        debug_assert!(self.undo.is_empty(), "a download of uncommitted rows");
        // Single-threaded at the fork, as for a snapshot (`fork_snapshot`).
        self.join_remover();
        let index = self.store.index(name).expect("a download of a validated index");
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the process is single-threaded here (above); the child
        // writes to one socket and leaves with `_exit`, running no
        // destructors of the parent's state.
        match unsafe { libc::fork() } {
            -1 => Err(StreamError::Fork(io::Error::last_os_error())),
            0 => {
                // SAFETY: plain syscalls on our own process and descriptors.
                let ready = unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // Every descriptor but the socket and standard error
                    // closed: other clients' sockets end when the loop
                    // closes them, not when this child does, and the data
                    // directory's lock stays the server's alone.
                    let fd = fd as libc::c_uint;
                    libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, fd - 1, 0);
                    libc::syscall(libc::SYS_close_range, fd + 1, libc::c_uint::MAX, 0);
                    libc::getppid() == parent && blocking_with_stall_limit(fd as RawFd)
                };
                let code = match ready {
                    true if send(fd, prefix, index).is_ok() => 0,
                    _ => 1,
                };
                // SAFETY: ends the child without unwinding into the parent's code.
                unsafe { libc::_exit(code) }
            }
            pid => {
                self.streams.push(pid);
                Ok(())
            }
        }
    }

    /// Forgets the downloads whose children have ended.
    pub(super) fn reap_streams(&mut self) {
        self.streams.retain(|&pid| {
            let mut status = 0;
            // SAFETY: waits, without blocking, for our own child.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 }
        });
    }
}

/// Makes the child's socket block, each send giving up after the stall limit.
///
/// # Safety
/// `fd` is an open socket.
unsafe fn blocking_with_stall_limit(fd: RawFd) -> bool {
    let flags = libc::fcntl(fd, libc::F_GETFL);
    let stall = libc::timeval {
        tv_sec: (SNAPSHOT_SEND_STALL_MS / 1000) as libc::time_t,
        tv_usec: ((SNAPSHOT_SEND_STALL_MS % 1000) * 1000) as libc::suseconds_t,
    };
    let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    flags >= 0
        && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
        && libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, (&raw const stall).cast(), size) == 0
}

/// The child's work: the prefix, then the image.
fn send(fd: RawFd, prefix: &[u8], index: &crate::store::Index) -> io::Result<()> {
    // SAFETY: the socket is open for the life of the child; ManuallyDrop
    // leaves closing it to `_exit`.
    let socket = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let mut out = BufWriter::with_capacity(1 << 20, &*socket);
    out.write_all(prefix)?;
    snapshot::write_image(&mut out, index)?;
    out.flush()
}

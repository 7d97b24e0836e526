//! Backups while serving: one index's snapshot image sent to a client by a
//! forked child, from its copy-on-write image of the store, while this
//! process goes on serving and writing. What the child sends is the index
//! as of the fork, whole: the writes that follow change the parent's pages,
//! not the child's.

use std::io::{self, BufWriter, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::time::{Duration, Instant};

use super::Database;
use crate::limits::{
    SNAPSHOT_DOWNLOADS_MAX, SNAPSHOT_SEND_CALL_BYTES, SNAPSHOT_SEND_RATE_MIN_BYTES, SNAPSHOT_SEND_STALL_MS,
};
use crate::snapshot;
use crate::transport::Wire;

/// How much lower the download child's priority is than the server's. Not
/// the idle class, nor nice 19: on a machine whose cores are all busy a
/// child that low gets next to no CPU, and holds its download slot and its
/// copy-on-write memory for as long (the 503s of `SNAPSHOT_DOWNLOADS_MAX`
/// came while tests ran in parallel); and neither made the writes' p99
/// during downloads any better (BENCHMARKS.md).
const DOWNLOAD_NICENESS: libc::c_int = 10;

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
    /// then this answer's head), then index `name`'s snapshot image, to
    /// `wire` (the socket, through its TLS session if it has one), at most
    /// `rate` bytes a second (0: as fast as the client takes them), and ends.
    /// The caller lets go of the socket without shutting it down: it is the
    /// child's now, and so is the session's copy.
    pub fn stream_index(&mut self, name: &str, prefix: &[u8], wire: Wire<'_>, rate: u64) -> Result<(), StreamError> {
        self.reap_streams();
        if self.streams.len() >= SNAPSHOT_DOWNLOADS_MAX {
            return Err(StreamError::Busy);
        }
        debug_assert!(self.undo.is_empty(), "a download of uncommitted rows");
        // Single-threaded at the fork, as for a snapshot (`fork_snapshot`).
        self.join_remover();
        let index = self.store.index(name).expect("a download of a validated index");
        let fd = wire.fd();
        let forking = Instant::now();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // The child reads this index's rows alone (`send`).
        let rows_only = self.store.rows_for_forks(Some(name));
        // SAFETY: the process is single-threaded here (above); the child
        // writes to one socket and leaves with `_exit`, running no
        // destructors of the parent's state, and reads of the store only
        // what `send` writes, `index`'s parts, which `rows_only` leaves it.
        let forked = unsafe { libc::fork() };
        if forked != 0 {
            drop(rows_only);
        }
        match forked {
            -1 => Err(StreamError::Fork(io::Error::last_os_error())),
            0 => {
                // SAFETY: plain syscalls on our own process and descriptors.
                let ready = unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // Every descriptor but the socket and standard error
                    // closed: other clients' sockets end when the loop
                    // closes them, not when this child does, and the data
                    // directory's lock stays the server's alone.
                    // Behind the loop for the CPU: a copy may wait, answers should not.
                    libc::nice(DOWNLOAD_NICENESS);
                    close_all_but(fd) && libc::getppid() == parent && blocking_with_stall_limit(fd)
                };
                let code = match ready {
                    true if send(wire, prefix, index, rate).is_ok() => {
                        // SAFETY: the child's own socket.
                        unsafe { end_gracefully(fd) };
                        0
                    }
                    _ => 1,
                };
                // SAFETY: ends the child without unwinding into the parent's code.
                unsafe { libc::_exit(code) }
            }
            pid => {
                self.streams.push(pid);
                let (ms, bytes) = (forking.elapsed().as_secs_f64() * 1e3, snapshot::image_bytes(index));
                crate::log::info(
                    "download_started",
                    format_args!(
                        "snapshot download of index {name} ({bytes} bytes) started, child forked in {ms:.1} ms"
                    ),
                );
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

/// Closes every descriptor from 3 on but `keep`; false if some could not be.
///
/// # Safety
/// Only in a forked child, whose descriptors nothing else uses.
unsafe fn close_all_but(keep: RawFd) -> bool {
    let Ok(keep) = libc::c_uint::try_from(keep) else { return false };
    let close_range = |first: libc::c_uint, last: libc::c_uint| {
        first > last || libc::syscall(libc::SYS_close_range, first, last, 0) == 0
    };
    if close_range(3, keep.saturating_sub(1)) && close_range(keep + 1, libc::c_uint::MAX) {
        return true;
    }
    // Without close_range (a kernel before 5.9, or a filter that refuses
    // it): one by one, up to the most this process may open.
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
        return false;
    }
    for fd in 3..limit.rlim_cur.min(1 << 20) as RawFd {
        if fd != keep as RawFd {
            libc::close(fd);
        }
    }
    true
}

/// After the last byte: our side shut, then what the client still sends
/// read and dropped until it closes (or a while passes), so that unread
/// bytes never turn the close into a reset that could lose the image's end.
///
/// # Safety
/// `fd` is the child's open, blocking socket.
unsafe fn end_gracefully(fd: RawFd) {
    libc::shutdown(fd, libc::SHUT_WR);
    let wait = libc::timeval { tv_sec: 2, tv_usec: 0 };
    let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&raw const wait).cast(), size);
    let mut scratch = [0u8; 4096];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline && libc::read(fd, scratch.as_mut_ptr().cast(), scratch.len()) > 0 {}
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

/// The child's writer to its socket: at most `SNAPSHOT_SEND_CALL_BYTES` a
/// call, no faster than `rate` bytes a second (0: as fast as the socket
/// takes them), failing once its deadline has passed.
struct Paced<W: Write> {
    inner: W,
    started: Instant,
    deadline: Instant,
    rate: u64,
    sent: u64,
}

impl<W: Write> Paced<W> {
    fn in_time(&self) -> io::Result<()> {
        match Instant::now() > self.deadline {
            true => Err(io::Error::new(io::ErrorKind::TimedOut, "the download took too long")),
            false => Ok(()),
        }
    }

    /// Counts `sent` bytes, and goes on only once they are due.
    fn paced(&mut self, sent: usize) -> usize {
        self.sent += sent as u64;
        if self.rate > 0 {
            let due = Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
            if let Some(early) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(early);
            }
        }
        sent
    }
}

impl<W: Write> Write for Paced<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.in_time()?;
        let sent = self.inner.write(&bytes[..bytes.len().min(SNAPSHOT_SEND_CALL_BYTES)])?;
        Ok(self.paced(sent))
    }

    /// TLS records come this way, many a call, up to the same cap.
    fn write_vectored(&mut self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.in_time()?;
        let mut room = SNAPSHOT_SEND_CALL_BYTES;
        let mut taken = Vec::with_capacity(slices.len());
        for slice in slices {
            if room == 0 {
                break;
            }
            let len = slice.len().min(room);
            taken.push(io::IoSlice::new(&slice[..len]));
            room -= len;
        }
        let sent = self.inner.write_vectored(&taken)?;
        Ok(self.paced(sent))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The child's work: the prefix, then the image, then (over TLS) the
/// session's close.
fn send(wire: Wire<'_>, prefix: &[u8], index: &crate::store::Index, rate: u64) -> io::Result<()> {
    // SAFETY: the socket is open for the life of the child; ManuallyDrop
    // leaves closing it to `_exit`.
    let socket = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(wire.fd()) });
    // A whole download has a deadline too: a client taking a byte now and
    // then would otherwise hold its child, and its memory, for ever. The
    // slowest pace allowed (`config`) sends well within it, TLS records'
    // framing and all.
    let bytes = prefix.len() as u64 + snapshot::image_bytes(index);
    let seconds = SNAPSHOT_SEND_STALL_MS / 1000 + bytes / SNAPSHOT_SEND_RATE_MIN_BYTES;
    let started = Instant::now();
    let paced = Paced { inner: &*socket, started, deadline: started + Duration::from_secs(seconds), rate, sent: 0 };
    let mut out = BufWriter::with_capacity(1 << 20, wire.writer(paced));
    out.write_all(prefix)?;
    snapshot::write_image(&mut out, index)?;
    out.flush()?;
    out.get_mut().finish()
}

//! A client's bytes on the wire: plain TCP, or TLS over it (`--tls-cert`,
//! `--tls-key`).
//!
//! TLS is rustls's, which is sans-IO: it never touches a socket itself, so
//! the one event loop drives it as it drives plain sockets. A connection
//! reads and writes plaintext through its [`Transport`]; underneath, records
//! are read from the socket into the session and decrypted, and replies are
//! encrypted into the session and written out as the socket takes them. The
//! socket stays non-blocking and edge-triggered, and the rule of the loop
//! holds: read until `WouldBlock`, and a readiness event comes for the rest.
//!
//! Records the session made but the socket has not taken yet (a reply, a
//! handshake message, an alert) are output the connection still owes, like
//! the bytes of its write buffer: `has_pending` says so, and the loop
//! flushes them when the socket is writable.
//!
//! A snapshot download's child (`db::streams`) gets the session with the
//! socket, as a [`Wire`]: after the fork it holds its own copy of the
//! session, and goes on encrypting where the server stopped (the server
//! never writes to that connection again).

use std::fs;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

use crate::limits::{TLS_FRAMING_BYTE_WEIGHT, TLS_PENDING_BYTES_MAX};

/// The server's TLS settings, made once at start and shared by every session.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ServerConfig>,
}

impl Tls {
    /// Reads the certificate chain and private key (PEM files). An error
    /// names the file and what is wrong with it.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls, String> {
        let read = |path: &Path, what: &str| {
            fs::read(path).map_err(|e| format!("cannot read the TLS {what} {}: {e}", path.display()))
        };
        let cert_pem = read(cert_path, "certificate")?;
        let key_pem = read(key_path, "private key")?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the TLS certificate {} is not PEM: {e}", cert_path.display()))?;
        if chain.is_empty() {
            return Err(format!("the TLS certificate {} holds no CERTIFICATE block", cert_path.display()));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            format!(
                "the TLS private key {} holds no PEM private key (PKCS #8, PKCS #1 or SEC1): {e}",
                key_path.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                format!(
                    "the TLS certificate {} and private key {} cannot be used together: {e}",
                    cert_path.display(),
                    key_path.display()
                )
            })?;
        // HTTP/1.1 is all this server speaks; a client that asks for
        // another protocol alone is refused in the handshake.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { config: Arc::new(config) })
    }
}

/// One client's socket, and its TLS session if the server has one.
pub struct Transport {
    socket: TcpStream,
    session: Option<Box<ServerConnection>>,
    /// The first byte from the client was looked at (TLS only).
    sniffed: bool,
    /// TLS bytes read from the socket, and plaintext read from them, so
    /// far; and the framing (their difference) already charged (`read_cost`).
    wire_in: u64,
    plain_in: u64,
    framing_charged: u64,
    /// TLS bytes the socket took since `take_progress`.
    sent: usize,
}

/// The content type of a TLS handshake record: the first byte a TLS client sends.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Why a read on a TLS connection failed on the client's account.
#[derive(Debug)]
pub enum Refusal {
    /// The client spoke plain HTTP: the transport is plain from then on,
    /// so that the refusal reaches the client in words it reads.
    PlainHttp,
    /// The client broke the TLS protocol: the session has queued the
    /// alert that says why, which leaves with the connection's last flush.
    Broken(rustls::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::PlainHttp => f.write_str("plain HTTP on a TLS port"),
            Refusal::Broken(error) => write!(f, "TLS: {error}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// The refusal a read failed with, if it failed on the client's account.
pub fn refusal(error: &io::Error) -> Option<&Refusal> {
    error.get_ref().and_then(|inner| inner.downcast_ref::<Refusal>())
}

impl Transport {
    /// A socket just accepted: plain, or at the start of a TLS handshake.
    pub fn new(socket: TcpStream, tls: Option<&Tls>) -> io::Result<Transport> {
        let session = match tls {
            Some(tls) => {
                let mut session = ServerConnection::new(tls.config.clone()).map_err(io::Error::other)?;
                session.set_buffer_limit(Some(TLS_PENDING_BYTES_MAX));
                Some(Box::new(session))
            }
            None => None,
        };
        Ok(Transport { socket, session, sniffed: false, wire_in: 0, plain_in: 0, framing_charged: 0, sent: 0 })
    }

    pub fn socket(&mut self) -> &mut TcpStream {
        &mut self.socket
    }

    /// Whether records the session made still wait for the socket.
    pub fn has_pending(&self) -> bool {
        self.session.as_ref().is_some_and(|session| session.wants_write())
    }

    /// Writes the records waiting in the session: `Ok(true)` once none
    /// wait, `Ok(false)` when the socket is full.
    pub fn send_pending(&mut self) -> io::Result<bool> {
        let Some(session) = &mut self.session else { return Ok(true) };
        send_records(session, &mut self.socket, &mut self.sent)
    }

    /// Whether the socket took TLS records since the last call: progress
    /// of a reader, as much as taking a reply's plaintext is.
    pub fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.sent) > 0
    }

    /// What reading `plaintext` bytes costs against a connection's read
    /// budget: the bytes, and over TLS the records' framing, weighted
    /// (`TLS_FRAMING_BYTE_WEIGHT`) for the decryption each record costs
    /// whatever its size. Plaintext decrypted but not read yet counts as
    /// framing until it is read, so it is charged once, early.
    pub fn read_cost(&mut self, plaintext: usize) -> usize {
        let framing = self.wire_in.saturating_sub(self.plain_in);
        let new = framing.saturating_sub(self.framing_charged);
        self.framing_charged += new;
        plaintext.saturating_add(usize::try_from(new).unwrap_or(usize::MAX).saturating_mul(TLS_FRAMING_BYTE_WEIGHT))
    }

    /// Shuts our side, once everything before is sent: a TLS session says
    /// so first (close_notify). `false` while the socket has not taken it
    /// all (call again when it is writable).
    pub fn shutdown_write(&mut self) -> bool {
        if let Some(session) = &mut self.session {
            // Queued once: the flag is the session's.
            session.send_close_notify();
            if !matches!(send_records(session, &mut self.socket, &mut self.sent), Ok(true) | Err(_)) {
                return false;
            }
        }
        let _ = self.socket.shutdown(Shutdown::Write);
        true
    }

    /// Reads and drops what the socket holds, below TLS: a closing
    /// connection only waits for the client's end.
    pub fn discard_input(&mut self, scratch: &mut [u8]) -> io::Result<usize> {
        self.socket.read(scratch)
    }

    /// The socket and session, for a child that takes over the sending
    /// (`db::streams`); the connection writes nothing after this.
    pub fn hand_off(&mut self) -> Wire<'_> {
        Wire { fd: self.socket.as_raw_fd(), session: self.session.as_deref_mut() }
    }
}

/// Plaintext in: `Ok(0)` is the client's end (with or without its
/// close_notify: a request cut short is the parser's to see).
impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.sniffed && self.session.is_some() {
            // A request line starts with a letter; a TLS client with a handshake record.
            let mut first = [0u8; 1];
            if self.socket.peek(&mut first)? == 0 {
                return Ok(0);
            }
            self.sniffed = true;
            if first[0] != TLS_HANDSHAKE_RECORD && first[0].is_ascii_alphabetic() {
                self.session = None;
                return Err(io::Error::new(io::ErrorKind::InvalidData, Refusal::PlainHttp));
            }
        }
        let Some(session) = &mut self.session else { return self.socket.read(buf) };
        loop {
            match session.reader().read(buf) {
                Ok(n) => {
                    self.plain_in += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            // No plaintext is buffered: records from the socket.
            let wire = session.read_tls(&mut self.socket)?;
            self.wire_in += wire as u64;
            if wire == 0 {
                // The end: the reader now says whether it was clean.
                session.process_new_packets().map_err(io::Error::other)?;
                continue;
            }
            if let Err(error) = session.process_new_packets() {
                // The alert that says why is queued; it leaves with the
                // connection's last flush.
                return Err(io::Error::new(io::ErrorKind::InvalidData, Refusal::Broken(error)));
            }
            // A handshake's answer leaves at once; what the socket does not
            // take now waits for it to be writable.
            send_records(session, &mut self.socket, &mut self.sent)?;
        }
    }
}

/// Plaintext out. A TLS session takes nothing while its earlier records
/// wait for the socket, and then at most `TLS_PENDING_BYTES_MAX`: what it
/// holds stays small, and a slow reader is held back by its socket as on
/// plain TCP (the rest of a reply waits in the connection's write buffer).
impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(session) = &mut self.session else { return self.socket.write(buf) };
        if !send_records(session, &mut self.socket, &mut self.sent)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let taken = session.writer().write(buf)?;
        send_records(session, &mut self.socket, &mut self.sent)?;
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes the session's waiting records until none wait (`true`) or the
/// socket would block (`false`; on a blocking socket, its send timeout
/// passed), adding the bytes the socket took to `sent`.
fn send_records(session: &mut ServerConnection, socket: &mut impl Write, sent: &mut usize) -> io::Result<bool> {
    while session.wants_write() {
        match session.write_tls(socket) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// `send_records` on a blocking socket: a send that waits past the
/// socket's timeout is an error.
fn send_all(session: &mut ServerConnection, socket: &mut impl Write) -> io::Result<()> {
    match send_records(session, socket, &mut 0)? {
        true => Ok(()),
        false => Err(io::Error::new(io::ErrorKind::TimedOut, "the client took no bytes for too long")),
    }
}

/// A socket handed to a download's child, with its TLS session if it has
/// one: in the child, [`Wire::writer`] sends plaintext through the
/// session's copy.
pub struct Wire<'a> {
    fd: RawFd,
    session: Option<&'a mut ServerConnection>,
}

impl<'a> Wire<'a> {
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Plaintext written to `socket` (the blocking socket of `fd`): as it
    /// is, or sealed into the session's records.
    pub fn writer<W: Write>(self, socket: W) -> Sealed<'a, W> {
        Sealed { session: self.session, socket }
    }
}

/// What a [`Wire`] writes through.
pub struct Sealed<'a, W: Write> {
    session: Option<&'a mut ServerConnection>,
    socket: W,
}

impl<W: Write> Sealed<'_, W> {
    /// After the last byte: a TLS session says it is closing, so that the
    /// client knows the image is whole.
    pub fn finish(&mut self) -> io::Result<()> {
        if let Some(session) = &mut self.session {
            session.send_close_notify();
            send_all(session, &mut self.socket)?;
        }
        self.socket.flush()
    }
}

impl<W: Write> Write for Sealed<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(session) = &mut self.session else { return self.socket.write(buf) };
        // Whatever waits from before the fork goes first.
        send_all(session, &mut self.socket)?;
        let taken = session.writer().write(buf)?;
        send_all(session, &mut self.socket)?;
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
    }
}

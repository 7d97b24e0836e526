//! The links between nodes: Raft's messages over TCP, in the server's own
//! event loop, on the port of `--peer-addr`.
//!
//! A node sends on the connections it opens and receives on those it
//! accepts: one link each way per pair of nodes, so neither side ever
//! waits for the other to pick a connection. An outgoing connection leaves
//! from the node's own peer address (bound before it connects), so that a
//! firewall rule can tell the nodes apart on one machine.
//!
//! Every link proves it knows the cluster secret before anything it sends
//! is read, without the secret on the wire:
//!
//! ```text
//! acceptor  -> "QVRC" version:u8 challenge:[u8; 32]          (fresh random bytes)
//! connector -> "QVRH" version:u8 from:u64 to:u64 port:u16 mac:[u8; 32]
//!              mac = HMAC-SHA256(secret, "quiver peer" challenge from to port)
//! connector -> { kind:u8 length:u64 message:[u8; length] }*  (protobuf `eraftpb.Message`)
//! ```
//!
//! A frame's kind is 1 for a message; a snapshot (the whole state, for a
//! node too far behind) goes as two frames: its data (kind 3, raw bytes,
//! up to the machine's memory), then its message without the data (kind
//! 2, within the message limit). Protobuf cannot carry 4 GiB in one field;
//! a frame's u64 length can. The data is sent in pieces (`Piece`): the
//! state's files go from the page cache to the socket (`sendfile`), never
//! through the sender's memory, so sending the whole state neither holds
//! a copy of it nor stalls the loop to make one.
//!
//! Integers are little-endian. `port` is where the connector listens for
//! peers: with the connection's source address (a node's own, see above),
//! where a node that does not know it yet (one just added, not yet sent the
//! members) answers it. The challenge is new for every connection,
//! so a recorded hello opens nothing; a hello for another node, or with a
//! wrong mac, closes the connection and is logged. Only the acceptor checks:
//! a connector only ever sends, so a false acceptor learns no secret and
//! can feed it nothing.
//!
//! Limits as on the client side: a frame's length (`frame_bytes_max`; a
//! snapshot's, the machine's memory: it must fit there whole), the
//! bytes waiting to go to one peer (`OUTGOING_BYTES_MAX`: past it, messages
//! are dropped and Raft is told the peer is unreachable, and it sends again
//! later), the time a handshake may take, how often a lost peer is dialled.
//! Messages for a peer whose link is being dialled wait behind the hello,
//! within the same limit: a peer back up hears the first message sent it,
//! not the one after the next heartbeat (and its answer likewise).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use sha2::Sha256;
use slab::Slab;

use crate::files::Sending;
use crate::http::ReadBuf;
use crate::log as oplog;
use crate::store::aligned::Aligned;

const CHALLENGE_MAGIC: &[u8; 4] = b"QVRC";
const HELLO_MAGIC: &[u8; 4] = b"QVRH";
const VERSION: u8 = 2;
const CHALLENGE_BYTES: usize = 4 + 1 + 32;
const HELLO_BYTES: usize = 4 + 1 + 8 + 8 + 2 + 32;
const MAC_CONTEXT: &[u8] = b"quiver peer";
const FRAME_HEADER_BYTES: usize = 1 + 8;
const MESSAGE_FRAME: u8 = 1;
const SNAPSHOT_FRAME: u8 = 2;
const SNAPSHOT_DATA_FRAME: u8 = 3;

/// Most bytes waiting to be sent to one peer: twice Raft's window of
/// appends to a follower (`node::INFLIGHT_MESSAGES_MAX` messages of
/// `node::MESSAGE_BYTES_MAX`). Past it, messages are refused, and Raft
/// sends them again later.
pub const OUTGOING_BYTES_MAX: usize = 64 << 20;

/// How long a connection may take to prove itself (or to be accepted).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after a failed dial the next one may start.
const REDIAL_AFTER: Duration = Duration::from_millis(200);

/// How long sent bytes may go unacknowledged before the kernel gives the
/// connection up (TCP_USER_TIMEOUT): a peer cut off by the network is
/// dialled anew, instead of waiting out TCP's retransmission backoff
/// (minutes) once the network heals.
const UNACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes read from a link at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Most accepted connections still to prove themselves: past it, new ones
/// are closed at once, so that strangers on the peer port cannot take
/// the process's descriptors or memory.
const HANDSHAKES_MAX: usize = 64;

/// Most bytes a link's buffers keep once drained (a snapshot grows them).
const BUFFER_KEEP_BYTES_MAX: usize = 32 << 20;

/// Sent bytes a link's buffer keeps before it drops them (it drops them
/// anyway whenever it is drained whole).
const SENT_KEEP_BYTES_MAX: usize = 1 << 20;

type HmacSha256 = Hmac<Sha256>;

/// What proves a hello: the mac of the challenge and both ids.
fn mac(secret: &[u8], challenge: &[u8; 32], from: u64, to: u64, port: u16) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(MAC_CONTEXT);
    mac.update(challenge);
    mac.update(&from.to_le_bytes());
    mac.update(&to.to_le_bytes());
    mac.update(&port.to_le_bytes());
    mac
}

/// Where a link stands.
enum State {
    /// Ours, connecting: waits for the challenge.
    Dialing { peer: u64, since: Instant },
    /// Ours, proven: sends frames.
    Sending { peer: u64 },
    /// Theirs, accepted: the challenge is sent, the hello awaited.
    Challenged { challenge: [u8; 32], since: Instant },
    /// Theirs, proven: receives frames from `peer`.
    Receiving { peer: u64 },
}

/// A piece of a snapshot's data, as it is sent.
pub enum Piece {
    Bytes(Vec<u8>),
    /// A file, to its length when it was opened: a state's files are never
    /// written again, only removed, which leaves an open one whole.
    File(Sending),
}

impl Piece {
    /// A whole file, as long as it is now.
    pub fn file(file: File) -> io::Result<Piece> {
        Ok(Piece::File(Sending::new(file)?))
    }

    /// Bytes left to send.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        match self {
            Piece::Bytes(bytes) => bytes.len() as u64,
            Piece::File(file) => file.left(),
        }
    }
}

struct Link {
    socket: TcpStream,
    state: State,
    address: SocketAddr,
    read: ReadBuf,
    /// Bytes to send; invariant `written <= write.len()`.
    write: Vec<u8>,
    written: usize,
    /// What goes after `write`, in order: a snapshot's pieces, then the
    /// frames queued behind them (`out`).
    queued: VecDeque<Piece>,
    /// A snapshot's data being received: it is read from the socket
    /// straight into its place, not through `read`.
    data_in: Option<Incoming>,
    /// A snapshot's data received, waiting for its message.
    snapshot_data: Option<Aligned<u8>>,
    /// Frames queued while ours is dialled: they go after the hello.
    early: Vec<u8>,
}

/// Bytes of a snapshot's data being received whose pages are faulted in
/// ahead of the socket's bytes (`Incoming`).
const FAULT_AHEAD_BYTES: usize = 64 << 20;

/// A snapshot's data being received. Its pages are faulted in on the
/// pool's threads at once, `FAULT_AHEAD_BYTES` ahead of what has come: one
/// thread taking each fresh page's fault as the socket's bytes land was
/// most of a node's time receiving a state. Ahead, not whole: what a
/// frame's length claims is not held before its bytes come.
struct Incoming {
    /// Invariant `filled <= data.len()`: the bytes come so far.
    data: Aligned<u8>,
    filled: usize,
    /// The bytes faulted in (some may have come already).
    faulted: usize,
}

impl Incoming {
    fn new(length: usize) -> Incoming {
        let mut incoming = Incoming { data: Aligned::zeroed(length), filled: 0, faulted: 0 };
        incoming.fault_ahead();
        incoming
    }

    /// Notes `n` more bytes come.
    fn advance(&mut self, n: usize) {
        self.filled += n;
        assert!(self.filled <= self.data.len(), "more of a snapshot's data than its frame holds");
        self.fault_ahead();
    }

    fn fault_ahead(&mut self) {
        let from = self.faulted.max(self.filled);
        if from < self.data.len() && from - self.filled < FAULT_AHEAD_BYTES / 2 {
            let to = (self.filled + FAULT_AHEAD_BYTES).min(self.data.len());
            self.data.fault_in_bytes(from..to);
            self.faulted = to;
        }
    }
}

impl Link {
    fn new(socket: TcpStream, state: State, address: SocketAddr) -> Link {
        Link {
            socket,
            state,
            address,
            read: ReadBuf::with_capacity(0),
            write: Vec::new(),
            written: 0,
            queued: VecDeque::new(),
            data_in: None,
            snapshot_data: None,
            early: Vec::new(),
        }
    }

    fn pending_bytes(&self) -> usize {
        let queued: u64 = self.queued.iter().map(Piece::len).sum();
        self.write.len() - self.written + self.early.len() + usize::try_from(queued).unwrap_or(usize::MAX)
    }

    /// Where the next frame goes: behind everything queued, or behind the
    /// hello still to be sent.
    fn out(&mut self) -> &mut Vec<u8> {
        if matches!(self.state, State::Dialing { .. }) {
            return &mut self.early;
        }
        if self.queued.is_empty() {
            return &mut self.write;
        }
        if !matches!(self.queued.back(), Some(Piece::Bytes(_))) {
            self.queued.push_back(Piece::Bytes(Vec::new()));
        }
        match self.queued.back_mut() {
            Some(Piece::Bytes(bytes)) => bytes,
            _ => unreachable!("a piece of bytes was just made the last"),
        }
    }

    /// Sends what the socket takes, `write` and then the pieces queued;
    /// false if the link broke.
    fn flush(&mut self) -> bool {
        loop {
            if !self.flush_write() {
                return false;
            }
            if self.written < self.write.len() {
                return true;
            }
            match self.queued.front_mut() {
                None => return true,
                Some(Piece::Bytes(_)) => {
                    let Some(Piece::Bytes(bytes)) = self.queued.pop_front() else { unreachable!("matched above") };
                    (self.write, self.written) = (bytes, 0);
                }
                Some(Piece::File(file)) => {
                    while file.left() > 0 {
                        match file.send(&self.socket) {
                            // Shorter than when it was opened: the frame
                            // cannot be finished.
                            Ok(0) => return false,
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => return false,
                        }
                    }
                    self.queued.pop_front();
                }
            }
        }
    }

    /// Sends what the socket takes of `write`; false if the link broke.
    fn flush_write(&mut self) -> bool {
        while self.written < self.write.len() {
            match self.socket.write(&self.write[self.written..]) {
                Ok(0) => return false,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // A peer that keeps up but never drains us whole must
                    // not make the buffer keep all it was ever sent.
                    // Only once the sent part is the larger: each byte is
                    // then moved at most once, whatever the backlog.
                    if self.written > SENT_KEEP_BYTES_MAX && 2 * self.written >= self.write.len() {
                        self.write.drain(..self.written);
                        self.written = 0;
                    }
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.write.clear();
        self.written = 0;
        // A snapshot sent must not keep its size in this buffer for good.
        if self.write.capacity() > BUFFER_KEEP_BYTES_MAX {
            self.write = Vec::new();
        }
        true
    }

    /// Reads what the socket has of the `wanted` bytes a handshake still
    /// needs, no more: nothing is taken from a stranger beyond its hello.
    fn fill_to(&mut self, wanted: usize) -> bool {
        let mut chunk = [0u8; HELLO_BYTES];
        while self.read.pending().len() < wanted {
            let need = (wanted - self.read.pending().len()).min(chunk.len());
            match self.socket.read(&mut chunk[..need]) {
                Ok(0) => return false,
                Ok(n) => self.read.extend(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Reads what the socket has (the rest of a snapshot's data first,
    /// into its place); false if the link ended or broke.
    fn fill(&mut self) -> bool {
        loop {
            let read = match &mut self.data_in {
                Some(incoming) if incoming.filled < incoming.data.len() => {
                    self.socket.read(&mut incoming.data[incoming.filled..]).inspect(|&n| incoming.advance(n))
                }
                _ => self.read.read_from(&mut self.socket, READ_CHUNK_BYTES),
            };
            match read {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// Why a message was not queued for its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undelivered {
    /// No link to it is open yet (one is being dialled), or it has no address.
    NoLink,
    /// Too many bytes already wait for it.
    Backlog,
}

pub struct Peers {
    me: u64,
    secret: Vec<u8>,
    /// The address outgoing connections leave from (none when the node
    /// listens on every address).
    own_ip: Option<IpAddr>,
    listener: TcpListener,
    registry: Registry,
    /// Tokens from `token_base` are ours: the listener, then a link each.
    token_base: usize,
    links: Slab<Link>,
    /// Each peer's address, and its outgoing link once one is dialled.
    addresses: BTreeMap<u64, SocketAddr>,
    /// Where peers not in `addresses` said they listen, when they dialled us.
    announced: BTreeMap<u64, SocketAddr>,
    /// The port this node listens on, told to every peer it dials.
    port: u16,
    outgoing: BTreeMap<u64, usize>,
    /// When each peer may next be dialled.
    redial_at: BTreeMap<u64, Instant>,
    frame_bytes_max: usize,
    snapshot_bytes_max: usize,
}

impl Peers {
    /// Listens on `address` for the other nodes, with tokens from `token_base`.
    pub fn bind(
        me: u64,
        address: SocketAddr,
        secret: &[u8],
        registry: &Registry,
        token_base: usize,
        frame_bytes_max: usize,
    ) -> io::Result<Peers> {
        let mut listener = TcpListener::bind(address)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen for peers on {address}: {e}")))?;
        registry.register(&mut listener, Token(token_base), Interest::READABLE)?;
        let own_ip = Some(address.ip()).filter(|ip| !ip.is_unspecified());
        let port = listener.local_addr()?.port();
        Ok(Peers {
            me,
            secret: secret.to_vec(),
            own_ip,
            listener,
            registry: registry.try_clone()?,
            token_base,
            links: Slab::new(),
            addresses: BTreeMap::new(),
            announced: BTreeMap::new(),
            port,
            outgoing: BTreeMap::new(),
            redial_at: BTreeMap::new(),
            frame_bytes_max,
            snapshot_bytes_max: memory_bytes(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Whether `token` is one of ours.
    pub fn owns(&self, token: Token) -> bool {
        token.0 >= self.token_base
    }

    /// Notes where `peer` listens (a member added, or the first members).
    pub fn set_address(&mut self, peer: u64, address: SocketAddr) {
        if self.addresses.insert(peer, address) != Some(address) {
            if let Some(key) = self.outgoing.remove(&peer) {
                self.close(key);
            }
        }
    }

    /// Forgets a peer that is no longer a member.
    pub fn forget(&mut self, peer: u64) {
        self.addresses.remove(&peer);
        self.announced.remove(&peer);
        if let Some(key) = self.outgoing.remove(&peer) {
            self.close(key);
        }
    }

    /// The peers whose address is known.
    pub fn known(&self) -> impl Iterator<Item = u64> + '_ {
        self.addresses.keys().copied()
    }

    /// Whether a proven link to `peer` is open now.
    pub fn reachable(&self, peer: u64) -> bool {
        self.outgoing.get(&peer).is_some_and(|&key| matches!(self.links[key].state, State::Sending { .. }))
    }

    /// The link to `peer` that can take more, dialling it if no link is
    /// open. One being dialled takes messages (`early`), so that the
    /// first after a peer comes back are not lost to the dial: Raft would
    /// wait a heartbeat to send again, and the answer another. A snapshot
    /// waits for a proven link (`proven`).
    fn sending_link(&mut self, peer: u64, proven: bool, now: Instant) -> Result<usize, Undelivered> {
        if !self.outgoing.contains_key(&peer) {
            self.dial(peer, now);
        }
        let Some(&key) = self.outgoing.get(&peer) else { return Err(Undelivered::NoLink) };
        let link = &self.links[key];
        if proven && !matches!(link.state, State::Sending { .. }) {
            return Err(Undelivered::NoLink);
        }
        if link.pending_bytes() > OUTGOING_BYTES_MAX {
            return Err(Undelivered::Backlog);
        }
        Ok(key)
    }

    /// Queues `message` for its peer, dialling it if no link is open. A
    /// snapshot goes by `send_snapshot`, with its data in pieces.
    pub fn send(&mut self, message: &Message, now: Instant) -> Result<(), Undelivered> {
        assert_ne!(message.get_msg_type(), MessageType::MsgSnapshot, "a snapshot goes by send_snapshot");
        let key = self.sending_link(message.to, false, now)?;
        let out = self.links[key].out();
        let start = out.len();
        if !write_frame(out, MESSAGE_FRAME, message) {
            out.truncate(start);
            return Err(Undelivered::NoLink);
        }
        Ok(())
    }

    /// Queues snapshot `message` for its peer with `data` as its data, in
    /// pieces (what the message itself carries is left out).
    pub fn send_snapshot(&mut self, message: &Message, data: Vec<Piece>, now: Instant) -> Result<(), Undelivered> {
        let key = self.sending_link(message.to, true, now)?;
        let link = &mut self.links[key];
        let mut light = message.clone();
        light.mut_snapshot().data = Default::default();
        let mut frame = Vec::new();
        if !write_frame(&mut frame, SNAPSHOT_FRAME, &light) {
            return Err(Undelivered::NoLink);
        }
        let length: u64 = data.iter().map(Piece::len).sum();
        let out = link.out();
        out.push(SNAPSHOT_DATA_FRAME);
        out.extend_from_slice(&length.to_le_bytes());
        link.queued.extend(data);
        link.queued.push_back(Piece::Bytes(frame));
        Ok(())
    }

    /// Sends what every link has queued.
    pub fn flush(&mut self) {
        let broken: Vec<usize> = self
            .links
            .iter_mut()
            .filter_map(|(key, link)| (link.pending_bytes() > 0 && !link.flush()).then_some(key))
            .collect();
        for key in broken {
            self.close(key);
        }
    }

    /// Starts a connection to `peer` from our own address, unless one is
    /// open or a failed one was too recent.
    fn dial(&mut self, peer: u64, now: Instant) {
        let Some(&address) = self.addresses.get(&peer).or_else(|| self.announced.get(&peer)) else { return };
        if self.outgoing.contains_key(&peer) || self.redial_at.get(&peer).is_some_and(|&at| now < at) {
            return;
        }
        self.redial_at.insert(peer, now + REDIAL_AFTER);
        match connect_from(self.own_ip, address) {
            Ok(socket) => {
                let key = self.insert(socket, State::Dialing { peer, since: now }, address);
                if let Some(key) = key {
                    self.outgoing.insert(peer, key);
                }
            }
            Err(e) => {
                oplog::debug("peer_connect_failed", format_args!("peer {peer} at {address}: cannot connect: {e}"))
            }
        }
    }

    fn insert(&mut self, mut socket: TcpStream, state: State, address: SocketAddr) -> Option<usize> {
        let entry = self.links.vacant_entry();
        let token = Token(self.token_base + 1 + entry.key());
        if self.registry.register(&mut socket, token, Interest::READABLE | Interest::WRITABLE).is_err() {
            return None;
        }
        let _ = socket.set_nodelay(true);
        let key = entry.key();
        entry.insert(Link::new(socket, state, address));
        Some(key)
    }

    fn close(&mut self, key: usize) {
        if !self.links.contains(key) {
            return;
        }
        let mut link = self.links.remove(key);
        let _ = self.registry.deregister(&mut link.socket);
        if let State::Dialing { peer, .. } | State::Sending { peer } = link.state {
            if self.outgoing.get(&peer) == Some(&key) {
                self.outgoing.remove(&peer);
            }
        }
    }

    /// Handles readiness of one of our tokens: accepts, proves, reads.
    /// Messages received are appended to `inbox`.
    pub fn on_event(&mut self, token: Token, now: Instant, inbox: &mut Vec<Message>) {
        if token.0 == self.token_base {
            self.accept(now);
            return;
        }
        let key = token.0 - self.token_base - 1;
        let mut proven = None;
        if self.links.contains(key) && !self.service(key, inbox, &mut proven) {
            self.close(key);
        }
        if let Some((from, listens)) = proven {
            if !self.addresses.contains_key(&from) {
                self.announced.insert(from, listens);
            }
            // A peer dials again when its link broke, maybe without our
            // side seeing it: its older links go.
            let older: Vec<usize> = self
                .links
                .iter()
                .filter(|&(other, link)| {
                    other != key && matches!(link.state, State::Receiving { peer } if peer == from)
                })
                .map(|(other, _)| other)
                .collect();
            for other in older {
                self.close(other);
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((socket, address)) => {
                    let handshakes =
                        self.links.iter().filter(|(_, link)| matches!(link.state, State::Challenged { .. })).count();
                    if handshakes >= HANDSHAKES_MAX {
                        oplog::client_warning(
                            "peer_refused",
                            now,
                            format_args!(
                                "peer connection from {address} refused: {handshakes} others are proving themselves"
                            ),
                        );
                        continue;
                    }
                    let mut challenge = [0u8; 32];
                    if getrandom::fill(&mut challenge).is_err() {
                        oplog::error(
                            "peer_refused",
                            format_args!("no random bytes for a peer challenge; refusing {address}"),
                        );
                        continue;
                    }
                    let Some(key) = self.insert(socket, State::Challenged { challenge, since: now }, address) else {
                        continue;
                    };
                    let link = &mut self.links[key];
                    link.write.extend_from_slice(CHALLENGE_MAGIC);
                    link.write.push(VERSION);
                    link.write.extend_from_slice(&challenge);
                    if !link.flush() {
                        self.close(key);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    oplog::warn("peer_accept_failed", format_args!("accepting a peer failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Reads and writes what link `key` can; false if it must close.
    /// A link proven in this call names its peer, and where it listens, in `proven`.
    fn service(&mut self, key: usize, inbox: &mut Vec<Message>, proven: &mut Option<(u64, SocketAddr)>) -> bool {
        let (me, frame_bytes_max, snapshot_bytes_max) = (self.me, self.frame_bytes_max, self.snapshot_bytes_max);
        let link = &mut self.links[key];
        if !link.flush() {
            return false;
        }
        let mut open = match link.state {
            State::Challenged { .. } => link.fill_to(HELLO_BYTES),
            _ => link.fill(),
        };
        loop {
            if let Some(incoming) = &mut link.data_in {
                // The bytes read before the data's frame was seen are its first.
                let pending = link.read.pending();
                let (filled, length) = (incoming.filled, incoming.data.len());
                let take = (length - filled).min(pending.len());
                incoming.data[filled..filled + take].copy_from_slice(&pending[..take]);
                incoming.advance(take);
                link.read.consume(take);
                if filled + take < length {
                    break;
                }
                link.snapshot_data = link.data_in.take().map(|incoming| incoming.data);
                continue;
            }
            let pending = link.read.pending();
            match link.state {
                State::Dialing { peer, .. } => {
                    if pending.len() < CHALLENGE_BYTES {
                        break;
                    }
                    if &pending[..4] != CHALLENGE_MAGIC || pending[4] != VERSION {
                        oplog::warn(
                            "peer_closed",
                            format_args!("peer {peer} at {}: not a quiver peer port", link.address),
                        );
                        return false;
                    }
                    let challenge: [u8; 32] = pending[5..CHALLENGE_BYTES].try_into().expect("32 bytes");
                    link.read.consume(CHALLENGE_BYTES);
                    let proof = mac(&self.secret, &challenge, me, peer, self.port).finalize().into_bytes();
                    link.write.extend_from_slice(HELLO_MAGIC);
                    link.write.push(VERSION);
                    link.write.extend_from_slice(&me.to_le_bytes());
                    link.write.extend_from_slice(&peer.to_le_bytes());
                    link.write.extend_from_slice(&self.port.to_le_bytes());
                    link.write.extend_from_slice(&proof);
                    link.write.append(&mut link.early);
                    link.state = State::Sending { peer };
                    if !link.flush() {
                        return false;
                    }
                }
                State::Challenged { challenge, .. } => {
                    if pending.len() < HELLO_BYTES {
                        break;
                    }
                    let from = u64::from_le_bytes(pending[5..13].try_into().expect("8 bytes"));
                    let to = u64::from_le_bytes(pending[13..21].try_into().expect("8 bytes"));
                    let port = u16::from_le_bytes(pending[21..23].try_into().expect("2 bytes"));
                    let good = &pending[..4] == HELLO_MAGIC
                        && pending[4] == VERSION
                        && to == me
                        && from != me
                        && from != 0
                        && mac(&self.secret, &challenge, from, to, port)
                            .verify_slice(&pending[23..HELLO_BYTES])
                            .is_ok();
                    if !good {
                        oplog::client_warning(
                            "peer_refused",
                            Instant::now(),
                            format_args!(
                                "peer connection from {} refused: it did not prove it knows the cluster secret \
                                 (or is for another node)",
                                link.address
                            ),
                        );
                        return false;
                    }
                    link.read.consume(HELLO_BYTES);
                    link.state = State::Receiving { peer: from };
                    *proven = Some((from, SocketAddr::new(link.address.ip(), port)));
                    // Proven: what it sent after its hello is read now (no
                    // new readiness comes for bytes already there).
                    open &= link.fill();
                }
                State::Receiving { peer } => {
                    if pending.len() < FRAME_HEADER_BYTES {
                        // A snapshot received must not keep its size here for good.
                        link.read.shrink_when_idle(BUFFER_KEEP_BYTES_MAX, 0);
                        break;
                    }
                    let kind = pending[0];
                    let length = u64::from_le_bytes(pending[1..FRAME_HEADER_BYTES].try_into().expect("8 bytes"));
                    let limit = match kind {
                        MESSAGE_FRAME | SNAPSHOT_FRAME => frame_bytes_max,
                        SNAPSHOT_DATA_FRAME => snapshot_bytes_max,
                        _ => {
                            oplog::warn(
                                "peer_closed",
                                format_args!("peer {peer}: a frame of unknown kind {kind}; closing"),
                            );
                            return false;
                        }
                    };
                    let Some(length) = usize::try_from(length).ok().filter(|&length| length <= limit) else {
                        oplog::warn(
                            "peer_closed",
                            format_args!("peer {peer}: a frame of {length} bytes, over the limit; closing"),
                        );
                        return false;
                    };
                    if kind == SNAPSHOT_DATA_FRAME {
                        if link.snapshot_data.is_some() {
                            oplog::warn(
                                "peer_closed",
                                format_args!("peer {peer}: a snapshot's data without its message; closing"),
                            );
                            return false;
                        }
                        link.data_in = Some(Incoming::new(length));
                        // What is pending moves over (above); the rest is
                        // read there (`fill`).
                        link.read.consume(FRAME_HEADER_BYTES);
                        continue;
                    }
                    let end = FRAME_HEADER_BYTES + length;
                    if pending.len() < end {
                        link.read.reserve_pending(end);
                        break;
                    }
                    let body = &pending[FRAME_HEADER_BYTES..end];
                    match Message::parse_from_bytes(body) {
                        // A snapshot only in its own kind of frame, after its data.
                        Ok(message)
                            if (message.get_msg_type() == MessageType::MsgSnapshot) != (kind == SNAPSHOT_FRAME)
                                || (kind == SNAPSHOT_FRAME) != link.snapshot_data.is_some() =>
                        {
                            oplog::warn(
                                "peer_closed",
                                format_args!(
                                    "peer {peer}: a {:?} in a frame of kind {kind}; closing",
                                    message.get_msg_type()
                                ),
                            );
                            return false;
                        }
                        // A peer speaks for itself only.
                        Ok(mut message) if message.from == peer => {
                            if let Some(data) = link.snapshot_data.take() {
                                message.mut_snapshot().data = bytes::Bytes::from_owner(data);
                            }
                            inbox.push(message);
                        }
                        Ok(message) => {
                            link.snapshot_data = None;
                            oplog::warn(
                                "peer_message_dropped",
                                format_args!(
                                    "peer {peer}: dropped a message claiming to be from node {}",
                                    message.from
                                ),
                            );
                        }
                        Err(e) => {
                            oplog::warn(
                                "peer_closed",
                                format_args!("peer {peer}: a frame that is not a Raft message ({e}); closing"),
                            );
                            return false;
                        }
                    }
                    link.read.consume(end);
                }
                // Nothing is read from a link we send on.
                State::Sending { .. } => {
                    let n = pending.len();
                    link.read.consume(n);
                    break;
                }
            }
        }
        open
    }

    /// Closes links whose handshake took too long.
    pub fn sweep(&mut self, now: Instant) {
        let stale: Vec<usize> = self
            .links
            .iter()
            .filter(|(_, link)| match link.state {
                State::Dialing { since, .. } | State::Challenged { since, .. } => {
                    now.duration_since(since) > HANDSHAKE_TIMEOUT
                }
                _ => false,
            })
            .map(|(key, _)| key)
            .collect();
        for key in stale {
            self.close(key);
        }
    }
}

/// Appends `message` as a frame of `kind`; false if it does not encode.
fn write_frame(out: &mut Vec<u8>, kind: u8, message: &Message) -> bool {
    let start = out.len();
    out.push(kind);
    out.extend_from_slice(&[0; 8]);
    if message.write_to_vec(out).is_err() {
        return false;
    }
    let length = (out.len() - start - FRAME_HEADER_BYTES) as u64;
    out[start + 1..start + FRAME_HEADER_BYTES].copy_from_slice(&length.to_le_bytes());
    true
}

/// The machine's memory: no snapshot larger can be held to be restored
/// (unknown: no limit but the address space's).
fn memory_bytes() -> usize {
    let total = sysinfo::System::new().map_or(0, |mut system| {
        system.refresh_memory();
        system.total_memory()
    });
    usize::try_from(total).ok().filter(|&total| total > 0).unwrap_or(usize::MAX)
}

/// A non-blocking connection to `address`, leaving from `own_ip` if given.
fn connect_from(own_ip: Option<IpAddr>, address: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_TIMEOUT))?;
    if let Some(ip) = own_ip {
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    match socket.connect(&address.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};

    /// A message sent before the link to its peer is proven is not lost
    /// to the dial: it follows the hello, the first a peer back up hears.
    #[test]
    fn a_message_sent_while_its_link_is_dialled_arrives() {
        let mut poll = Poll::new().expect("a poll");
        let secret = [7u8; 32];
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let mut a = Peers::bind(1, loopback, &secret, poll.registry(), 0, 1 << 20).expect("bound");
        let mut b = Peers::bind(2, loopback, &secret, poll.registry(), 1000, 1 << 20).expect("bound");
        a.set_address(2, b.local_addr().expect("an address"));
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgHeartbeat);
        (message.from, message.to, message.term) = (1, 2, 5);
        a.send(&message, Instant::now()).expect("queued while the link is dialled");
        assert!(!a.reachable(2), "not proven yet");
        let (mut inbox, mut events) = (Vec::new(), Events::with_capacity(64));
        let deadline = Instant::now() + Duration::from_secs(10);
        while inbox.is_empty() {
            assert!(Instant::now() < deadline, "the message never arrived");
            a.flush();
            b.flush();
            poll.poll(&mut events, Some(Duration::from_millis(50))).expect("polled");
            for event in events.iter() {
                let peers = if b.owns(event.token()) { &mut b } else { &mut a };
                peers.on_event(event.token(), Instant::now(), &mut inbox);
            }
        }
        assert_eq!((inbox.len(), inbox[0].term, inbox[0].get_msg_type()), (1, 5, MessageType::MsgHeartbeat));
        assert!(a.reachable(2));
    }

    /// What waits for a link being dialled is held to the backlog of a
    /// proven one: past `OUTGOING_BYTES_MAX`, messages are refused.
    #[test]
    fn a_link_being_dialled_takes_no_more_than_the_backlog() {
        let poll = Poll::new().expect("a poll");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let mut a = Peers::bind(1, loopback, &[7; 32], poll.registry(), 0, 64 << 20).expect("bound");
        // Never polled: the link stays dialled, whatever is at the address.
        a.set_address(2, "127.0.0.1:9".parse().expect("an address"));
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgAppend);
        (message.from, message.to) = (1, 2);
        message.mut_entries().push(raft::eraftpb::Entry { data: vec![1; 8 << 20].into(), ..Default::default() });
        let now = Instant::now();
        let taken = (0..20).take_while(|_| a.send(&message, now).is_ok()).count();
        assert_eq!(a.send(&message, now), Err(Undelivered::Backlog));
        let key = a.outgoing[&2];
        assert!(matches!(a.links[key].state, State::Dialing { .. }));
        assert!(
            taken >= 8 && a.links[key].pending_bytes() <= OUTGOING_BYTES_MAX + message.compute_size() as usize + 16
        );
    }

    /// A state's data is faulted in ahead of what has come, never much
    /// further: a frame's length alone holds no more than a window.
    #[test]
    fn a_state_received_is_faulted_in_a_window_ahead() {
        let length = 3 * FAULT_AHEAD_BYTES + 12_345;
        let mut incoming = Incoming::new(length);
        assert_eq!(incoming.faulted, FAULT_AHEAD_BYTES);
        for step in [1, 4095, 10 << 20, 5, FAULT_AHEAD_BYTES + 7].into_iter().cycle() {
            let n = step.min(length - incoming.filled);
            let filled = incoming.filled;
            incoming.data[filled..filled + n].fill((filled % 251) as u8);
            incoming.advance(n);
            let (filled, faulted) = (incoming.filled, incoming.faulted);
            assert!(faulted <= length && faulted <= filled + FAULT_AHEAD_BYTES, "{filled} {faulted}");
            assert!(faulted >= (filled + FAULT_AHEAD_BYTES / 2).min(length), "{filled} {faulted}");
            if filled == length {
                break;
            }
        }
    }
}

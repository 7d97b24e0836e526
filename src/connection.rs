//! One client socket: its buffers, its parser, and where it stands.
//!
//! A connection never closes itself: `service` and `flush` report what
//! should happen and the loop (`server::clients`) acts on it.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use crate::api::{ApiError, App, Caller, Endpoint, Gate, Handled, Seat, Target};
use crate::http::{Event, Framing, FramingLimits, HttpError, Parser, ReadBuf};
use crate::limits::{
    BUF_KEEP_BYTES_MAX, READ_BUF_INITIAL_BYTES, READ_BYTES_PER_TICK_MAX, READ_CHUNK_BYTES, WRITE_PENDING_BYTES_MAX,
};
use crate::log;
use crate::transport::{self, Refusal, Transport};

/// How long a closing connection keeps reading (and discarding) what the
/// client is still sending, so that our last answer is not lost to a reset.
const LINGER: Duration = Duration::from_secs(2);

/// What `service` left the connection needing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing to do until the socket is ready again.
    Waiting,
    /// It used its share of this tick and has more to do.
    MoreWork,
    /// Close it now, without writing anything more.
    Close,
}

/// What `flush` left the connection needing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flushed {
    /// Everything is written.
    All,
    /// The socket took part of it; wait for it to be writable.
    Partly,
    /// Close it now.
    Close,
}

pub struct Connection {
    /// Its key in the loop's slab: who a cluster's answer is for.
    key: usize,
    /// The socket, and the TLS session over it if the server has one.
    transport: Transport,
    peer: SocketAddr,
    read: ReadBuf,
    /// When to give back what large bodies grew `read` to.
    read_grown: crate::memory::Linger,
    parser: Parser,
    /// Replies not yet sent. Invariant: `written <= sync_mark's reply_at (if any) <= write.len()`.
    write: Vec<u8>,
    written: usize,
    /// The answer to a write, which may not leave before the log is synced
    /// (or, in a cluster, is not yet written: it comes once the write is
    /// applied, and nothing more is read until then).
    sync_mark: Option<Held>,
    /// Where its read stands with the cluster (`api::replicated`).
    gate: Gate,
    /// The verdict on the current request, taken when its head arrived.
    admitted: Option<Result<Target, ApiError>>,
    requests_per_tick_max: usize,
    /// Edge-triggered readiness: the socket may hold unread bytes.
    pub readable: bool,
    /// No more requests are read: the answer in `write` is the last one.
    closing: bool,
    /// Its socket is a child's, sending a download (`App::stream`): the
    /// loop lets go of it, writing nothing more, shutting nothing down.
    handed_off: bool,
    /// `service` stopped because too many replies wait to be sent.
    blocked_on_write: bool,
    /// Its place in the search batching protocol (`api::batch`).
    seat: Seat,
    /// The body bytes of the search parked on `seat`, for its log line.
    parked_body_bytes: usize,
    /// Set once our side is shut down; the connection only drains input until then.
    linger_until: Option<Instant>,
    last_activity: Instant,
    request_started: Option<Instant>,
}

impl Connection {
    pub fn new(
        key: usize,
        transport: Transport,
        peer: SocketAddr,
        limits: FramingLimits,
        requests_per_tick_max: usize,
        now: Instant,
    ) -> Connection {
        Connection {
            key,
            transport,
            peer,
            read: ReadBuf::with_capacity(READ_BUF_INITIAL_BYTES),
            read_grown: crate::memory::Linger::default(),
            parser: Parser::new(limits),
            requests_per_tick_max,
            write: Vec::new(),
            written: 0,
            sync_mark: None,
            gate: Gate::default(),
            admitted: None,
            readable: true,
            closing: false,
            handed_off: false,
            blocked_on_write: false,
            seat: Seat::default(),
            parked_body_bytes: 0,
            linger_until: None,
            last_activity: now,
            request_started: None,
        }
    }

    pub fn socket(&mut self) -> &mut TcpStream {
        self.transport.socket()
    }

    fn write_pending_bytes(&self) -> usize {
        debug_assert!(self.written <= self.write.len());
        self.write.len() - self.written
    }

    /// Replies not yet sent, or TLS records (a reply's, the handshake's)
    /// the socket has not taken.
    pub fn has_output(&self) -> bool {
        self.write_pending_bytes() > 0 || self.transport.has_pending()
    }

    /// Between requests, with nothing received and nothing to send.
    pub fn is_idle(&self) -> bool {
        self.parser.is_idle() && self.read.is_empty() && !self.has_output() && self.sync_mark.is_none()
    }

    /// Reads and answers requests until the socket is drained, this tick's
    /// share is used, or the replies wait on a slow reader.
    pub fn service(&mut self, app: &mut App, shutting_down: bool, now: Instant) -> Progress {
        if self.handed_off {
            return Progress::Close;
        }
        if let Some(until) = self.linger_until {
            return self.drain_lingering(until, now);
        }
        let (mut requests, mut read_bytes) = (0, 0);
        self.blocked_on_write = false;
        loop {
            if self.closing || self.awaits_cluster() {
                return Progress::Waiting;
            }
            if self.write_pending_bytes() > WRITE_PENDING_BYTES_MAX {
                self.blocked_on_write = true;
                return Progress::Waiting;
            }
            match self.parser.advance(&mut self.read) {
                Event::Head => {
                    self.request_started.get_or_insert(now);
                    self.on_head(app, now);
                }
                Event::Request => {
                    if let Some(Ok(target)) = &self.admitted {
                        if app.must_wait(target) {
                            // Another connection's write awaits its sync this tick.
                            return Progress::MoreWork;
                        }
                        if app.hold_read(target, &self.parser.head, self.key, &mut self.gate, now) {
                            // Woken when its read index is applied, or it timed out.
                            return Progress::Waiting;
                        }
                    }
                    if shutting_down {
                        self.parser.head.keep_alive = false;
                    }
                    let stop = self.answer(app, now);
                    requests += 1;
                    // One write or search per connection per turn: the answer
                    // waits for the sync or the batch, and what follows waits for it.
                    if stop || requests >= self.requests_per_tick_max {
                        return Progress::MoreWork;
                    }
                }
                Event::Error(error) => {
                    let body_bytes_max = self.parser.limits().body_bytes_max;
                    self.refuse(app, &ApiError::Http { error, body_bytes_max }, now);
                    return Progress::Waiting;
                }
                Event::NeedMore => {
                    if !self.read.is_empty() || !self.parser.is_idle() {
                        self.request_started.get_or_insert(now);
                    }
                    if !self.readable {
                        return Progress::Waiting;
                    }
                    if read_bytes >= READ_BYTES_PER_TICK_MAX {
                        return Progress::MoreWork;
                    }
                    match self.read.read_from(&mut self.transport, READ_CHUNK_BYTES) {
                        Ok(0) => return self.on_peer_closed(),
                        Ok(n) => {
                            read_bytes += self.transport.read_cost(n);
                            self.last_activity = now;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            self.readable = false;
                            return Progress::Waiting;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => match transport::refusal(&e) {
                            Some(Refusal::PlainHttp) => {
                                let error = HttpError::Malformed(
                                    "this port speaks HTTPS (the server runs with --tls-cert): use https://",
                                );
                                let body_bytes_max = self.parser.limits().body_bytes_max;
                                self.refuse(app, &ApiError::Http { error, body_bytes_max }, now);
                                return Progress::Waiting;
                            }
                            Some(Refusal::Broken(_)) => {
                                // Closed like a refused request: the alert
                                // leaves, our side shuts, and what the client
                                // still sends is read and dropped, so that a
                                // reset does not overtake the alert.
                                self.closing = true;
                                return Progress::Waiting;
                            }
                            None => return Progress::Close,
                        },
                    }
                }
            }
        }
    }

    fn on_head(&mut self, app: &mut App, now: Instant) {
        let verdict = app.admit(&self.parser.head);
        let has_body = self.parser.head.framing != Framing::None;
        match &verdict {
            Ok(_) if has_body && self.parser.head.expect_continue => {
                crate::http::response::write_continue(&mut self.write);
            }
            Ok(_) => {}
            Err(error) if has_body && self.parser.head.expect_continue => {
                // The client waits for our word before sending the body: refuse
                // now and close, rather than wait for a body it will not send.
                let error = error.clone();
                self.refuse(app, &error, now);
                return;
            }
            Err(_) => self.parser.discard_body(),
        }
        self.admitted = Some(verdict);
    }

    /// Answers the complete request, or parks it (a search, run later in
    /// the turn with the others); returns whether this connection must stop
    /// for this turn: it changed the store, or its answer is not written yet.
    fn answer(&mut self, app: &mut App, now: Instant) -> bool {
        let verdict = self.admitted.take().expect("a request's head is admitted before its body");
        let (head, body) = self.parser.request(&mut self.read);
        let keep_alive = head.keep_alive;
        let reply_at = self.write.len();
        let started = Instant::now();
        let body_bytes = body.len();
        let (handled, route) = match verdict {
            Ok(target) => {
                let caller = Caller { conn: self.key, gate: &mut self.gate, seat: &mut self.seat, now };
                (app.handle(&target, head, body, caller, &mut self.write), Some(target.endpoint))
            }
            Err(error) => (Handled::Answered(error.write(&mut self.write, keep_alive)), None),
        };
        let reply_bytes = self.write.len() - reply_at;
        match handled {
            // Counted when it is answered.
            Handled::Parked => self.parked_body_bytes = body_bytes,
            Handled::Answered(status) => {
                self.record(app, route, status, started.elapsed(), (body_bytes, reply_bytes));
            }
            // Counted when its status is final, after the sync.
            Handled::Mutated(status) => {
                debug_assert!(self.sync_mark.is_none());
                let elapsed = started.elapsed();
                let replicating = None;
                self.sync_mark = Some(Held { reply_at, keep_alive, route, status, elapsed, body_bytes, replicating });
            }
            Handled::Stream => {
                let status = match app.stream(&self.write[self.written..], self.transport.hand_off()) {
                    Ok(()) => {
                        self.handed_off = true;
                        self.closing = true;
                        self.written = self.write.len();
                        200
                    }
                    Err(error) => {
                        self.write.truncate(reply_at);
                        error.write(&mut self.write, keep_alive)
                    }
                };
                let reply_bytes = self.write.len() - reply_at;
                self.record(app, route, status, started.elapsed(), (body_bytes, reply_bytes));
            }
            // Counted when its answer comes.
            Handled::Replicating(seq) => {
                debug_assert!(self.sync_mark.is_none());
                let (status, elapsed, replicating) = (0, Duration::ZERO, Some((seq, started)));
                self.sync_mark = Some(Held { reply_at, keep_alive, route, status, elapsed, body_bytes, replicating });
            }
        }
        self.parser.finish(&mut self.read);
        if self.read.capacity() > BUF_KEEP_BYTES_MAX {
            self.read_grown.used();
        }
        self.request_started = None;
        if !keep_alive {
            self.closing = true;
        }
        !matches!(handled, Handled::Answered(_))
    }

    /// Writes the answer of this connection's parked search, which has
    /// run. Its request's head is still the parser's: the connection reads
    /// nothing more until this answer is written.
    pub fn complete_search(&mut self, app: &mut App) {
        let reply_at = self.write.len();
        if let Some((status, started)) = app.answer_parked(&mut self.seat, &mut self.write) {
            let bytes = (self.parked_body_bytes, self.write.len() - reply_at);
            self.record(app, Some(Endpoint::Search), status, started.elapsed(), bytes);
        }
    }

    /// Counts an answered request and, at debug level, logs it: the
    /// client, the request line, the status, body bytes in and reply bytes
    /// out, and the time from its body's arrival to its answer (a write's
    /// sync not included: the log's commit line times it).
    fn record(&self, app: &mut App, route: Option<Endpoint>, status: u16, elapsed: Duration, bytes: (usize, usize)) {
        app.metrics().observe_request(route, status, elapsed);
        if log::enabled(log::Level::Debug) {
            let head = &self.parser.head;
            let (peer, method, path, us) = (self.peer, head.method.as_str(), &head.path, elapsed.as_micros());
            let (body_bytes, reply_bytes) = bytes;
            let fields: [log::Field<'_>; 7] = [
                ("peer", &peer),
                ("method", &method),
                ("path", path),
                ("status", &status),
                ("body_bytes", &body_bytes),
                ("reply_bytes", &reply_bytes),
                ("us", &us),
            ];
            log::event(
                log::Level::Debug,
                "request",
                &fields,
                format_args!(
                    "{peer} {method} {path}: {status}, {body_bytes} bytes in, {reply_bytes} bytes out, {us} µs"
                ),
            );
        }
    }

    /// Whether an answer of this turn is still to be written (a parked
    /// search) or held (a write awaiting its sync): what this connection
    /// asks next must wait for the next turn, to be answered after it.
    pub fn answer_pending(&self) -> bool {
        self.seat.is_parked() || self.sync_mark.is_some()
    }

    pub fn awaits_sync(&self) -> bool {
        self.sync_mark.is_some_and(|held| held.replicating.is_none())
    }

    /// The number of its write waiting for the cluster, if one does.
    pub fn replicating(&self) -> Option<u64> {
        self.sync_mark.and_then(|held| held.replicating).map(|(seq, _)| seq)
    }

    /// Whether its write waits for the cluster.
    fn awaits_cluster(&self) -> bool {
        self.sync_mark.is_some_and(|held| held.replicating.is_some())
    }

    /// Takes the answer of its write from the cluster, if it has come.
    pub fn resolve(&mut self, app: &mut App) {
        let Some(Held { reply_at, route, replicating: Some((seq, started)), body_bytes, .. }) = self.sync_mark else {
            return;
        };
        let Some(answer) = app.take_answer(seq) else { return };
        debug_assert_eq!(self.write.len(), reply_at);
        self.write.extend_from_slice(&answer.bytes);
        self.sync_mark = None;
        self.record(app, route, answer.status, started.elapsed(), (body_bytes, answer.bytes.len()));
    }

    /// After the tick's sync: the held answer may go, or, if the sync
    /// failed, is replaced by the storage error (its write was undone);
    /// either is counted then, with the status the client gets.
    pub fn settle(&mut self, app: &mut App, synced: &Result<(), ApiError>) {
        if !self.awaits_sync() {
            return;
        }
        let Some(Held { reply_at, keep_alive, route, mut status, elapsed, body_bytes, .. }) = self.sync_mark.take()
        else {
            return;
        };
        if let Err(error) = synced {
            debug_assert!(self.written <= reply_at);
            self.write.truncate(reply_at);
            status = error.write(&mut self.write, keep_alive);
        }
        let reply_bytes = self.write.len() - reply_at;
        self.record(app, route, status, elapsed, (body_bytes, reply_bytes));
    }

    /// Answers with an error that ends the connection. Those that mean a
    /// limit was hit or the bytes were not HTTP are logged (rate-limited).
    pub fn refuse(&mut self, app: &mut App, error: &ApiError, now: Instant) {
        let started = self.request_started.unwrap_or(now);
        let reply_at = self.write.len();
        error.write(&mut self.write, false);
        self.closing = true;
        self.request_started = None;
        let elapsed = now.duration_since(started);
        app.metrics().observe_request(None, error.status(), elapsed);
        if log::enabled(log::Level::Debug) {
            let (peer, code, reply_bytes, us) =
                (self.peer, error.code(), self.write.len() - reply_at, elapsed.as_micros());
            log::debug(
                "request_failed",
                format_args!(
                    "{peer} (no complete request): {} {code}, {reply_bytes} bytes out, {us} µs",
                    error.status()
                ),
            );
        }
        if error.closes_connection() {
            log::client_warning(
                "connection_closed",
                now,
                format_args!("{}: {} ({}); closing the connection", self.peer, error, error.code()),
            );
        }
    }

    fn on_peer_closed(&mut self) -> Progress {
        self.readable = false;
        if self.read.is_empty() && self.parser.is_idle() {
            // A clean end between requests: send what is owed, then close.
            self.closing = true;
            Progress::Waiting
        } else {
            // The client ended mid-request: there is nobody to answer.
            Progress::Close
        }
    }

    fn drain_lingering(&mut self, until: Instant, now: Instant) -> Progress {
        if now >= until {
            return Progress::Close;
        }
        let mut scratch = [0u8; 4096];
        loop {
            match self.transport.discard_input(&mut scratch) {
                Ok(0) => return Progress::Close,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Progress::Waiting;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Progress::Close,
            }
        }
    }

    /// Sends buffered replies until done or the socket is full. An answer
    /// held for the log's sync, and what follows it, stays; so does the
    /// connection while a parked search of it has yet to be answered.
    pub fn flush(&mut self, now: Instant) -> Flushed {
        if self.handed_off {
            return Flushed::Close;
        }
        let sendable = self.sync_mark.map_or(self.write.len(), |held| held.reply_at);
        while self.written < sendable {
            match self.transport.write(&self.write[self.written..sendable]) {
                Ok(0) => return Flushed::Close,
                Ok(n) => {
                    self.written += n;
                    self.last_activity = now;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Flushed::Partly,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Flushed::Close,
            }
        }
        let sent = self.transport.send_pending();
        if self.transport.take_progress() {
            self.last_activity = now;
        }
        match sent {
            Ok(true) => {}
            Ok(false) => return Flushed::Partly,
            Err(_) => return Flushed::Close,
        }
        // An answer still to come (held for the sync, or a parked search
        // not yet run) keeps the buffer, and the connection, as they are.
        if self.sync_mark.is_some() || self.seat.is_parked() {
            return Flushed::Partly;
        }
        self.write.clear();
        self.written = 0;
        if self.write.capacity() > BUF_KEEP_BYTES_MAX {
            self.write = Vec::new();
        }
        if self.closing && self.linger_until.is_none() {
            // Our side shut first (over TLS, after its close_notify has
            // left), so that the client reads an end, not a cut.
            if !self.transport.shutdown_write() {
                return Flushed::Partly;
            }
            if self.readable || !self.read.is_empty() || !self.parser.is_idle() {
                // The client may still be sending: read what comes, close
                // on its end or after a while.
                self.linger_until = Some(now + LINGER);
                return Flushed::All;
            }
            return Flushed::Close;
        }
        Flushed::All
    }

    /// True when `service` stopped for a backlog of replies that has now
    /// shrunk: no readiness event will come for it, so the loop must return.
    pub fn resumable(&self) -> bool {
        self.blocked_on_write && self.write_pending_bytes() <= WRITE_PENDING_BYTES_MAX
    }

    pub fn is_lingering(&self) -> bool {
        self.linger_until.is_some()
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// At the periodic sweep: gives back the read buffer large bodies grew,
    /// once they have stopped coming (a client loading in batches reuses
    /// it meanwhile, instead of faulting in each body's pages afresh).
    pub fn sweep_buffers(&mut self) {
        if self.read_grown.quiet() {
            self.read.shrink_when_idle(BUF_KEEP_BYTES_MAX, READ_BUF_INITIAL_BYTES);
        }
    }

    /// What the periodic sweep decides for this connection.
    pub fn check_timeouts(
        &mut self,
        app: &mut App,
        now: Instant,
        idle_timeout: Duration,
        request_timeout: Duration,
    ) -> Timeout {
        if let Some(until) = self.linger_until {
            return if now >= until { Timeout::Close } else { Timeout::None };
        }
        if self.has_output() {
            // A client that does not take its replies is as slow as one that
            // does not send its request.
            if now.duration_since(self.last_activity) > request_timeout {
                let peer = self.peer;
                log::client_warning(
                    "slow_reader_closed",
                    now,
                    format_args!("{peer}: took no reply bytes for {request_timeout:?}; closing"),
                );
                return Timeout::Close;
            }
            return Timeout::None;
        }
        if let Some(started) = self.request_started {
            if now.duration_since(started) > request_timeout && !self.closing {
                self.refuse(app, &ApiError::Timeout, now);
                return Timeout::Answered;
            }
            return Timeout::None;
        }
        if self.is_idle() && now.duration_since(self.last_activity) > idle_timeout {
            return Timeout::Close;
        }
        Timeout::None
    }
}

/// A write's answer, held in `write` until the log is synced: where it
/// starts, whether its request kept the connection alive, and what is
/// counted and logged of it once its status is final (`settle`).
#[derive(Clone, Copy, Debug)]
struct Held {
    reply_at: usize,
    keep_alive: bool,
    route: Option<Endpoint>,
    status: u16,
    elapsed: Duration,
    body_bytes: usize,
    /// In a cluster: the number the write was proposed as, and when.
    replicating: Option<(u64, Instant)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    None,
    /// A 408 was queued; flush it, then close.
    Answered,
    Close,
}

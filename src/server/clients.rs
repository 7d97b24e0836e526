//! The connections and the app that answers them, and one turn of the loop
//! over them (`Clients::turn`, the "tick" of `--requests-per-tick-max`):
//! what the server runs after each poll, and what tests run to drive a real
//! connection in-process.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};
use slab::Slab;

use crate::api::App;
use crate::connection::{Connection, Flushed, Progress, Timeout};
use crate::http::FramingLimits;
use crate::transport::{Tls, Transport};

/// Tokens below this one are the server's own (its listener, its signals).
pub const FIRST_CONNECTION: usize = 2;

fn token_of(key: usize) -> Token {
    Token(key + FIRST_CONNECTION)
}

/// What a connection is given when it is accepted.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub framing: FramingLimits,
    pub requests_per_tick_max: usize,
}

pub struct Clients {
    registry: Registry,
    connections: Slab<Connection>,
    app: App,
    limits: ConnectionLimits,
    /// Set when clients speak TLS (`--tls-cert`).
    tls: Option<Tls>,
    /// Connections to service this turn, and those carried to the next.
    ready: Vec<usize>,
    carried: Vec<usize>,
    /// Connections with replies to send after this turn's requests.
    to_flush: Vec<usize>,
    /// Events for the server's own tokens, seen while the turn polled.
    own_events: Vec<Token>,
    shutting_down: bool,
    /// A failed sync of the cluster's log: the server must stop.
    fatal: Option<io::Error>,
}

impl Clients {
    /// Connections registered with `poll`'s registry, answered by `app`.
    pub fn new(poll: &Poll, app: App, limits: ConnectionLimits, capacity: usize) -> io::Result<Clients> {
        Ok(Clients {
            registry: poll.registry().try_clone()?,
            connections: Slab::with_capacity(capacity),
            app,
            limits,
            tls: None,
            ready: Vec::new(),
            carried: Vec::new(),
            to_flush: Vec::new(),
            own_events: Vec::new(),
            shutting_down: false,
            fatal: None,
        })
    }

    /// From now on, connections accepted speak TLS.
    pub fn serve_tls(&mut self, tls: Tls) {
        self.tls = Some(tls);
    }

    pub fn app(&mut self) -> &mut App {
        &mut self.app
    }

    pub fn len(&self) -> usize {
        self.connections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.connections.is_empty()
    }

    /// Whether some connection has work without waiting for an event: left
    /// over from the last turn, or accepted since (the next poll must not wait).
    pub fn has_work(&self) -> bool {
        !self.carried.is_empty() || !self.ready.is_empty()
    }

    /// Takes an accepted socket; it is serviced in the next turn.
    pub fn add(&mut self, socket: TcpStream, peer: SocketAddr, now: Instant) -> io::Result<usize> {
        let entry = self.connections.vacant_entry();
        let key = entry.key();
        let mut transport = Transport::new(socket, self.tls.as_ref())?;
        self.registry.register(transport.socket(), token_of(key), Interest::READABLE | Interest::WRITABLE)?;
        let ConnectionLimits { framing, requests_per_tick_max } = self.limits;
        entry.insert(Connection::new(key, transport, peer, framing, requests_per_tick_max, now));
        self.ready.push(key);
        let open = self.connections.len();
        self.app.metrics().set_open_connections(open);
        Ok(key)
    }

    /// The error that must stop the server, if one happened.
    pub fn take_fatal(&mut self) -> Option<io::Error> {
        self.fatal.take()
    }

    /// From now on, every answer closes its connection.
    pub fn shut_down(&mut self) {
        self.shutting_down = true;
    }

    /// The server's own tokens among the events polled since the last call.
    pub fn take_own_events(&mut self) -> std::vec::Drain<'_, Token> {
        self.own_events.drain(..)
    }

    /// Marks the connections that events name as ready; notes the server's own.
    pub fn take_events(&mut self, events: &Events) {
        for event in events.iter() {
            if self.app.peer_event(event.token()) {
                continue;
            }
            let Token(t) = event.token();
            if t < FIRST_CONNECTION {
                self.own_events.push(event.token());
                continue;
            }
            let key = t - FIRST_CONNECTION;
            if let Some(connection) = self.connections.get_mut(key) {
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    connection.readable = true;
                }
                self.ready.push(key);
            }
        }
    }

    /// One turn of the loop, after a poll whose `events` were taken: answer
    /// every ready connection (each within its share of the turn), parking
    /// searches; on a large index, send the replies that are ready and wait
    /// a moment on `poll` for more searches to join the batch; run the
    /// parked searches together; send the replies that wait on no write;
    /// sync the log once; then send the answers of the turn's writes, so
    /// that no write is acknowledged before it is on disk.
    pub fn turn(&mut self, poll: &mut Poll, events: &mut Events, now: Instant) {
        self.ready.append(&mut self.carried);
        self.service_ready(now);
        if let Some(window) = self.app.gather_window() {
            // Replies that are ready leave before the loop waits: only the
            // parked searches wait for the batch.
            self.flush_ready(now);
            let started = Instant::now();
            self.gather(poll, events, now + window);
            self.app.metrics().search_gathered(started.elapsed());
        }
        // The searches parked this turn, run together, and their answers.
        self.app.run_parked();
        for &key in &self.to_flush {
            if let Some(connection) = self.connections.get_mut(key) {
                connection.complete_search(&mut self.app);
            }
        }
        self.app.end_turn();
        // The cluster: messages, Raft, applying; the writes it answered,
        // and the reads it let go, are serviced again.
        match self.app.cluster_turn(now) {
            Ok(woken) => {
                for key in woken {
                    if let Some(connection) = self.connections.get_mut(key) {
                        connection.resolve(&mut self.app);
                        self.to_flush.push(key);
                        self.carried.push(key);
                    }
                }
            }
            Err(error) => self.fatal = Some(error),
        }
        // Replies that wait on no write leave before the sync...
        self.flush_ready(now);
        // ...then one sync for every write of the turn, then their answers.
        let synced = self.app.commit();
        for i in 0..self.to_flush.len() {
            let key = self.to_flush[i];
            if let Some(connection) = self.connections.get_mut(key) {
                if connection.awaits_sync() {
                    connection.settle(&mut self.app, &synced);
                    self.flush(key, now);
                }
            }
        }
        self.to_flush.clear();
        self.app.maintain();
    }

    /// Services the ready connections, noting those with replies to send.
    fn service_ready(&mut self, now: Instant) {
        self.ready.sort_unstable();
        self.ready.dedup();
        for i in 0..self.ready.len() {
            let key = self.ready[i];
            let Some(connection) = self.connections.get_mut(key) else { continue };
            match connection.service(&mut self.app, self.shutting_down, now) {
                Progress::Waiting => {}
                Progress::MoreWork => self.carried.push(key),
                Progress::Close => {
                    self.close(key);
                    continue;
                }
            }
            self.to_flush.push(key);
        }
        self.ready.clear();
    }

    /// Waits until `deadline` for more searches to join this turn's batch
    /// (see `api::batch`), servicing the connections that become ready
    /// meanwhile. One whose answer of this turn is still pending waits for
    /// the next turn, so that its answers stay in order. Any other is
    /// serviced now and its search may join the batch, even if the loop
    /// looked at it earlier this turn (a client answered in the last run
    /// is looked at first thing, often before it has asked again).
    fn gather(&mut self, poll: &mut Poll, events: &mut Events, deadline: Instant) {
        while self.app.gathering() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match poll.poll(events, Some(deadline - now)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            // The poll may have waited: what follows is stamped with when it woke.
            let now = Instant::now();
            self.take_events(events);
            let (ready, connections, carried) = (&mut self.ready, &self.connections, &mut self.carried);
            ready.retain(|&key| {
                let pending = connections.get(key).is_some_and(Connection::answer_pending);
                if pending {
                    carried.push(key);
                }
                !pending
            });
            self.service_ready(now);
        }
        // A connection serviced twice is answered and flushed once.
        self.to_flush.sort_unstable();
        self.to_flush.dedup();
    }

    /// Sends what each connection with replies this turn can send now:
    /// everything before an answer held for the sync or still to be run.
    fn flush_ready(&mut self, now: Instant) {
        for i in 0..self.to_flush.len() {
            let key = self.to_flush[i];
            self.flush(key, now);
        }
    }

    fn flush(&mut self, key: usize, now: Instant) {
        let Some(connection) = self.connections.get_mut(key) else { return };
        match connection.flush(now) {
            Flushed::All | Flushed::Partly if connection.resumable() => self.carried.push(key),
            Flushed::All | Flushed::Partly => {}
            Flushed::Close => self.close(key),
        }
    }

    /// Closes connections stalled past their limits.
    pub fn sweep(&mut self, now: Instant, idle: Duration, request: Duration) {
        let mut expired = Vec::new();
        for (key, connection) in self.connections.iter_mut() {
            connection.sweep_buffers();
            match connection.check_timeouts(&mut self.app, now, idle, request) {
                Timeout::None => {}
                Timeout::Answered => self.to_flush.push(key),
                Timeout::Close => expired.push(key),
            }
        }
        for key in expired {
            self.close(key);
        }
        self.flush_ready(now);
        self.to_flush.clear();
    }

    /// During shutdown: closes every connection with nothing in flight.
    pub fn close_idle(&mut self) {
        let idle: Vec<usize> = self
            .connections
            .iter()
            .filter(|(_, c)| {
                c.is_idle() || (c.is_closing() && !c.has_output() && !c.answer_pending()) || c.is_lingering()
            })
            .map(|(key, _)| key)
            .collect();
        for key in idle {
            self.close(key);
        }
    }

    fn close(&mut self, key: usize) {
        let mut connection = self.connections.remove(key);
        if let Some(seq) = connection.replicating() {
            self.app.forget_write(seq);
        }
        let _ = self.registry.deregister(connection.socket());
        let open = self.connections.len();
        self.app.metrics().set_open_connections(open);
    }
}

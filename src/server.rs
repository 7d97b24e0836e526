//! The event loop: one thread, one mio `Poll`.
//!
//! Each tick has a fixed order: take readiness events; read and answer every
//! complete request on every ready connection (each within its share of the
//! tick), parking searches; on a large index, send the replies that are
//! ready and wait a moment for more searches to join the batch; run the
//! parked searches together; send the replies that wait on no write; sync
//! the log once; then send the answers of the tick's writes, so that no write
//! is acknowledged before it is on disk.

use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use crate::api::decode::BodyLimits;
use crate::api::{ApiError, ApiLimits, App};
use crate::auth;
use crate::config::Config;
use crate::connection::{Connection, Flushed, Progress, Timeout};
use crate::db::{self, Database};
use crate::http::FramingLimits;
use crate::limits::{SHUTDOWN_DRAIN_MS, TIMEOUT_SWEEP_INTERVAL_MS};
use crate::log;

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const FIRST_CONNECTION: usize = 2;

fn token_of(key: usize) -> Token {
    Token(key + FIRST_CONNECTION)
}

/// Starts the server and runs it until SIGTERM or SIGINT.
pub fn run(config: Config) -> io::Result<()> {
    let started = Instant::now();
    // The port first, then the lock and recovery (which create the data
    // directory), then the key file: a second process, on the same port or
    // the same directory, stops before it writes anything to disk. Clients
    // that connect during recovery wait in the listen backlog.
    let address = resolve(&config.host, config.port)?;
    let listener =
        TcpListener::bind(address).map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
    let options = db::Options {
        data_dir: config.data_dir.clone(),
        snapshot_log_bytes: config.snapshot_log_bytes,
        repair_log: config.repair_log,
        sync: !config.unsafe_no_sync,
    };
    if config.unsafe_no_sync {
        log::warn(format_args!("--unsafe-no-sync: answered writes are not synced and can be lost on power failure"));
    }
    let database = Database::open(&options).map_err(io::Error::other)?;
    let (api_key, key_source) = auth::load_or_create(&config.data_dir, config.api_key.as_deref())?;
    raise_descriptor_limit(config.connections_max);
    let local = listener.local_addr()?;
    let key_source = match key_source {
        auth::KeySource::Flag => "from --api-key or QUIVER_API_KEY",
        auth::KeySource::KeyFile => "from the key file",
        auth::KeySource::Generated => "newly generated",
    };
    // Never the key itself: logs are shipped and read by others.
    log::banner(format_args!(
        "listening on {local}, data directory {}, API key {} ({key_source}, read it from {}), started in {} ms",
        config.data_dir.display(),
        auth::fingerprint(&api_key),
        config.data_dir.join(auth::KEY_FILE).display(),
        started.elapsed().as_millis()
    ));
    let limits = ApiLimits {
        dimensions_max: config.dimensions_max,
        k_max: config.k_max,
        reply_bytes_max: config.reply_bytes_max,
        body: BodyLimits {
            items_max: config.items_max,
            metadata_entries_max: config.metadata_entries_max,
            metadata_bytes_max: config.metadata_bytes_max,
        },
        indexes_max: config.indexes_max,
        index_name_bytes_max: config.index_name_bytes_max,
        metrics_public: config.metrics_public,
    };
    let app = App::new(database, api_key, limits);
    Server::new(config, listener, app)?.run()
}

/// Lifts the soft limit on open files to the hard limit, so that
/// `--connections-max` clients can be served where the soft limit is lower.
fn raise_descriptor_limit(connections_max: usize) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid struct for our own process.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let wanted = (connections_max as libc::rlim_t + 64).min(limit.rlim_max);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && (limit.rlim_cur as usize) < connections_max + 64 {
            log::warn(format_args!(
                "open files are limited to {}: fewer than --connections-max {connections_max} clients can connect",
                limit.rlim_cur
            ));
        }
    }
}

fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot resolve host {host}")))
}

struct Server {
    poll: Poll,
    listener: TcpListener,
    signals: Signals,
    connections: Slab<Connection>,
    app: App,
    config: Config,
    /// Connections to service this tick, and those carried to the next.
    ready: Vec<usize>,
    carried: Vec<usize>,
    /// Connections with replies to send after this tick's requests.
    to_flush: Vec<usize>,
    shutdown_deadline: Option<Instant>,
}

impl Server {
    fn new(config: Config, mut listener: TcpListener, app: App) -> io::Result<Server> {
        let poll = Poll::new()?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut signals = Signals::new([SIGTERM, SIGINT])?;
        poll.registry().register(&mut signals, SIGNALS, Interest::READABLE)?;
        Ok(Server {
            poll,
            listener,
            signals,
            connections: Slab::with_capacity(config.connections_max),
            app,
            config,
            ready: Vec::new(),
            carried: Vec::new(),
            to_flush: Vec::new(),
            shutdown_deadline: None,
        })
    }

    fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let sweep_interval = Duration::from_millis(TIMEOUT_SWEEP_INTERVAL_MS);
        let mut next_sweep = Instant::now() + sweep_interval;
        loop {
            let timeout = if self.carried.is_empty() { Some(sweep_interval) } else { Some(Duration::ZERO) };
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            self.ready.append(&mut self.carried);
            self.take_events(&events, now);
            self.tick(&mut events, now);
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + sweep_interval;
            }
            if let Some(deadline) = self.shutdown_deadline {
                self.close_idle();
                if self.connections.is_empty() || now >= deadline {
                    self.app.shutdown();
                    log::info(format_args!("shut down ({} connections cut off)", self.connections.len()));
                    return Ok(());
                }
            }
        }
    }

    /// Marks the connections that events name as ready; accepts and handles signals.
    fn take_events(&mut self, events: &Events, now: Instant) {
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(now),
                SIGNALS => self.on_signal(now),
                Token(t) => {
                    let key = t - FIRST_CONNECTION;
                    if let Some(connection) = self.connections.get_mut(key) {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            connection.readable = true;
                        }
                        self.ready.push(key);
                    }
                }
            }
        }
    }

    /// Answers every ready connection, then sends the replies.
    fn tick(&mut self, events: &mut Events, now: Instant) {
        self.service_ready(now);
        if let Some(window) = self.app.gather_window() {
            // Replies that are ready leave before the loop waits: only the
            // parked searches wait for the batch.
            self.flush_ready(now);
            let started = Instant::now();
            self.gather(events, now + window);
            self.app.metrics().search_gathered(started.elapsed());
        }
        // The searches parked this turn, run together, and their answers.
        self.app.run_parked();
        for i in 0..self.to_flush.len() {
            if let Some(connection) = self.connections.get_mut(self.to_flush[i]) {
                connection.complete_search(&mut self.app);
            }
        }
        self.app.end_turn();
        // Replies that wait on no write leave before the sync...
        self.flush_ready(now);
        // ...then one sync for every write of the tick, then their answers.
        let synced = self.app.commit();
        for i in 0..self.to_flush.len() {
            let key = self.to_flush[i];
            if let Some(connection) = self.connections.get_mut(key) {
                if connection.awaits_sync() {
                    connection.settle(&synced);
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
        let shutting_down = self.shutdown_deadline.is_some();
        for i in 0..self.ready.len() {
            let key = self.ready[i];
            let Some(connection) = self.connections.get_mut(key) else { continue };
            match connection.service(&mut self.app, shutting_down, now) {
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
    /// (see `App::gather_window`), servicing the connections that become
    /// ready meanwhile. One whose answer of this turn is still pending waits
    /// for the next turn, so that its answers stay in order. Any other is
    /// serviced now and its search may join the batch, even if the loop
    /// looked at it earlier this turn (a client answered in the last run
    /// is looked at first thing, often before it has asked again).
    fn gather(&mut self, events: &mut Events, deadline: Instant) {
        while self.app.gathering() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match self.poll.poll(events, Some(deadline - now)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            // The poll may have waited: what follows is stamped with when it woke.
            let now = Instant::now();
            self.take_events(events, now);
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

    /// Sends what each connection with replies this tick can send now:
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

    fn accept(&mut self, now: Instant) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        loop {
            let (mut socket, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or the like: keep serving who we have.
                    log::warn(format_args!("accept failed: {e}"));
                    return;
                }
            };
            if self.connections.len() >= self.config.connections_max {
                // A best-effort answer on a fresh socket, whose buffer takes it whole.
                let mut reply = Vec::new();
                ApiError::TooManyConnections.write(&mut reply, false);
                let _ = socket.write(&reply);
                self.app.metrics().connection_refused();
                let open = self.connections.len();
                log::client_warning(
                    now,
                    format_args!("{peer}: refused, {open} connections are open (--connections-max)"),
                );
                continue;
            }
            let _ = socket.set_nodelay(true);
            let entry = self.connections.vacant_entry();
            let key = entry.key();
            let interest = Interest::READABLE | Interest::WRITABLE;
            if let Err(e) = self.poll.registry().register(&mut socket, token_of(key), interest) {
                log::warn(format_args!("cannot register a connection: {e}"));
                continue;
            }
            let framing = FramingLimits {
                head_bytes_max: self.config.head_bytes_max,
                headers_max: self.config.headers_max,
                body_bytes_max: self.config.body_bytes_max,
                chunks_max: self.config.chunks_max,
                chunk_bytes_max: self.config.chunk_bytes_max,
            };
            entry.insert(Connection::new(socket, peer, framing, self.config.requests_per_tick_max, now));
            self.ready.push(key);
            let open = self.connections.len();
            let metrics = self.app.metrics();
            metrics.connection_accepted();
            metrics.set_open_connections(open);
        }
    }

    fn on_signal(&mut self, now: Instant) {
        if self.signals.pending().next().is_some() && self.shutdown_deadline.is_none() {
            log::info(format_args!("shutting down: answering requests in flight"));
            let _ = self.poll.registry().deregister(&mut self.listener);
            self.shutdown_deadline = Some(now + Duration::from_millis(SHUTDOWN_DRAIN_MS));
        }
    }

    /// Closes connections stalled past their limits.
    fn sweep(&mut self, now: Instant) {
        let idle = Duration::from_millis(self.config.idle_timeout_ms);
        let request = Duration::from_millis(self.config.request_timeout_ms);
        let mut expired = Vec::new();
        for (key, connection) in self.connections.iter_mut() {
            match connection.check_timeouts(&mut self.app, now, idle, request) {
                Timeout::None => {}
                Timeout::Answered => self.to_flush.push(key),
                Timeout::Close => expired.push(key),
            }
        }
        for key in expired {
            self.close(key);
        }
        for i in 0..self.to_flush.len() {
            let key = self.to_flush[i];
            self.flush(key, now);
        }
        self.to_flush.clear();
    }

    /// During shutdown: closes every connection with nothing in flight.
    fn close_idle(&mut self) {
        let idle: Vec<usize> = self
            .connections
            .iter()
            .filter(|(_, c)| c.is_idle() || (c.is_closing() && !c.has_output()) || c.is_lingering())
            .map(|(key, _)| key)
            .collect();
        for key in idle {
            self.close(key);
        }
    }

    fn close(&mut self, key: usize) {
        let mut connection = self.connections.remove(key);
        let _ = self.poll.registry().deregister(connection.socket());
        let open = self.connections.len();
        self.app.metrics().set_open_connections(open);
    }
}

//! The event loop: one thread, one mio `Poll`.
//!
//! The server binds its port, opens the database, and then loops: poll for
//! readiness; accept new connections and handle signals; run one turn over
//! the connections (`Clients::turn`: answer, gather and run searches, sync
//! the log, send); every `TIMEOUT_SWEEP_INTERVAL_MS`, close connections
//! stalled past their limits. On SIGTERM or SIGINT it stops accepting,
//! answers what is in flight for up to `SHUTDOWN_DRAIN_MS`, and syncs.

pub mod clients;

use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use crate::api::decode::BodyLimits;
use crate::api::{ApiError, ApiLimits, App};
use crate::auth;
use crate::config::Config;
use crate::db::{self, Database};
use crate::http::FramingLimits;
use crate::limits::{SHUTDOWN_DRAIN_MS, TIMEOUT_SWEEP_INTERVAL_MS};
use crate::log;
use crate::store::cpu;
use crate::transport::Tls;
use clients::{Clients, ConnectionLimits, FIRST_CONNECTION};

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
/// The peer links' tokens start here, far above any connection's.
const PEER_TOKENS: usize = 1 << 40;
const _: () = assert!(LISTENER.0 < FIRST_CONNECTION && SIGNALS.0 < FIRST_CONNECTION);

/// Starts the server and runs it until SIGTERM or SIGINT.
///
/// The loop runs on a thread of the scan pool (`--scan-threads`), made
/// here once: a large scan offers its parts to the pool's other threads,
/// and none is started per search (`store::scan::threads`).
pub fn run(config: Config) -> io::Result<()> {
    crate::memory::one_arena();
    let threads = config.scan_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|n| format!("quiver-{n}"))
        .build()
        .map_err(|e| io::Error::other(format!("cannot start the scan threads: {e}")))?;
    pool.install(|| serve(config))
}

/// `run`, on a thread of the scan pool.
fn serve(config: Config) -> io::Result<()> {
    let started = Instant::now();
    // The port first, then the lock and recovery (which create the data
    // directory), then the key file: a second process, on the same port or
    // the same directory, stops before it writes anything to disk. Clients
    // that connect during recovery wait in the listen backlog.
    // The scan paths before recovery, which builds the indexes' codes.
    let paths = cpu::Paths::choose(config.simd.into(), !config.no_int8_pass).map_err(io::Error::other)?;
    cpu::set(paths).map_err(io::Error::other)?;
    let address = resolve(&config.host, config.port)?;
    let listener =
        TcpListener::bind(address).map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
    // The certificate before recovery, which may take a while: a wrong
    // file stops the start at once.
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            Some(Tls::load(cert, key).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?)
        }
        _ => None,
    };
    let options = db::Options {
        data_dir: config.data_dir.clone(),
        snapshot_log_bytes: config.snapshot_log_bytes,
        repair_log: config.repair_log,
        sync: !config.unsafe_no_sync,
    };
    if config.unsafe_no_sync {
        log::warn(
            "unsafe_no_sync",
            format_args!("--unsafe-no-sync: answered writes are not synced and can be lost on power failure"),
        );
    }
    let threads = rayon::current_num_threads();
    log::info("scanning", format_args!("scanning with {}, {threads} threads", paths.describe()));
    let cluster = config.cluster().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (database, state) = match cluster {
        Some(_) => Database::open_replicated(&config.data_dir),
        None => Database::open(&options).map(|database| (database, None)),
    }
    .map_err(io::Error::other)?;
    if cluster.is_some() && !auth::has_key(&config.data_dir, config.api_key.as_deref()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a cluster node needs the API key every node shares (--api-key, QUIVER_API_KEY, or the key file in the \
             data directory); it never makes one up",
        ));
    }
    let (api_key, key_source) = auth::load_or_create(&config.data_dir, config.api_key.as_deref())?;
    raise_descriptor_limit(config.connections_max);
    let local = listener.local_addr()?;
    let key_path = config.data_dir.join(auth::KEY_FILE);
    if key_source == auth::KeySource::Generated {
        // The operator of a first start reads the key here (or in the
        // file), once; a key chosen by the operator is never echoed, and
        // no later start shows more than its first characters.
        // The key last on its line, so that it copies whole.
        log::banner(
            "api_key_generated",
            &[],
            format_args!(
                "API key (newly generated and written to {}; shown this once, later starts show only its \
             first characters): {api_key}",
                key_path.display()
            ),
        );
    }
    let key_source = match key_source {
        auth::KeySource::Flag => "from --api-key or QUIVER_API_KEY",
        auth::KeySource::KeyFile => "from the key file",
        auth::KeySource::Generated => "newly generated",
    };
    let read_only_key = auth::read_only_key(config.read_only_api_key.as_deref(), &api_key)?;
    let (data_dir, fingerprint, ms) =
        (config.data_dir.display(), auth::fingerprint(&api_key), started.elapsed().as_millis());
    // The address stays first, up to a comma: scripts read it there.
    let (scheme, tls_note) = if tls.is_some() { ("https", ", HTTPS only") } else { ("http", "") };
    let fields: [log::Field<'_>; 4] =
        [("address", &local), ("scheme", &scheme), ("data_dir", &data_dir), ("started_ms", &ms)];
    log::banner(
        "listening",
        &fields,
        format_args!(
            "listening on {local}{tls_note}, data directory {data_dir}, API key {fingerprint} ({key_source}, kept \
             in {}), started in {ms} ms",
            key_path.display(),
        ),
    );
    if let Some(key) = &read_only_key {
        let fingerprint = auth::fingerprint(key);
        log::banner(
            "read_only_key",
            &[],
            format_args!("read-only API key {fingerprint} (from --read-only-api-key or QUIVER_READ_ONLY_API_KEY)"),
        );
    }
    let limits = ApiLimits {
        dimensions_max: config.dimensions_max,
        k_max: config.k_max,
        search_batch_max: config.search_batch_max,
        reply_bytes_max: config.reply_bytes_max,
        body: BodyLimits {
            items_max: config.items_max,
            metadata_entries_max: config.metadata_entries_max,
            metadata_bytes_max: config.metadata_bytes_max,
            filter_depth_max: config.filter_depth_max,
            filter_terms_max: config.filter_terms_max,
        },
        indexes_max: config.indexes_max,
        index_name_bytes_max: config.index_name_bytes_max,
        metrics_public: config.metrics_public,
    };
    let mut app = App::new(database, api_key, limits);
    app.set_download_rate(config.snapshot_download_bytes_per_s);
    if let Some(key) = read_only_key {
        app.set_read_only_key(key);
    }
    let mut server = Server::new(config, listener, app)?;
    if let Some(tls) = tls {
        server.clients.serve_tls(tls);
    }
    if let Some(settings) = &cluster {
        // A command carries an upsert's items decoded: up to twice its body
        // (a value written `0,` in two bytes takes four). A message holds
        // one such command, or several up to Raft's message size.
        let entries_max = (2 * server.config.body_bytes_max).max(crate::cluster::node::MESSAGE_BYTES_MAX as usize);
        let frame_bytes_max = entries_max + crate::limits::PEER_FRAME_OVERHEAD_BYTES;
        let registry = server.poll.registry().try_clone()?;
        server
            .clients
            .app()
            .join_cluster(settings, state, &registry, PEER_TOKENS, frame_bytes_max)
            .map_err(io::Error::other)?;
        let peer_addr = server.clients.app().cluster().map(|c| c.replica().peer_addr());
        if let Some(Ok(peer_addr)) = peer_addr {
            let id = settings.node_id;
            let fields: [log::Field<'_>; 2] = [("node_id", &id), ("peer_address", &peer_addr)];
            log::banner(
                "cluster_node",
                &fields,
                format_args!("node {id} of a cluster, listening for peers on {peer_addr}"),
            );
        }
    }
    server.run()
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
            log::warn(
                "open_files_limited",
                format_args!(
                    "open files are limited to {}: fewer than --connections-max {connections_max} clients can connect",
                    limit.rlim_cur
                ),
            );
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
    clients: Clients,
    config: Config,
    shutdown_deadline: Option<Instant>,
}

impl Server {
    fn new(config: Config, mut listener: TcpListener, app: App) -> io::Result<Server> {
        let poll = Poll::new()?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut signals = Signals::new([SIGTERM, SIGINT])?;
        poll.registry().register(&mut signals, SIGNALS, Interest::READABLE)?;
        let limits = ConnectionLimits {
            framing: FramingLimits {
                head_bytes_max: config.head_bytes_max,
                headers_max: config.headers_max,
                body_bytes_max: config.body_bytes_max,
                chunks_max: config.chunks_max,
                chunk_bytes_max: config.chunk_bytes_max,
            },
            requests_per_tick_max: config.requests_per_tick_max,
        };
        let clients = Clients::new(&poll, app, limits, config.connections_max)?;
        Ok(Server { poll, listener, signals, clients, config, shutdown_deadline: None })
    }

    fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let sweep_interval = Duration::from_millis(TIMEOUT_SWEEP_INTERVAL_MS);
        let idle = Duration::from_millis(self.config.idle_timeout_ms);
        let request = Duration::from_millis(self.config.request_timeout_ms);
        let mut next_sweep = Instant::now() + sweep_interval;
        loop {
            let mut timeout = if self.clients.has_work() { Duration::ZERO } else { sweep_interval };
            if let Some(deadline) = self.clients.app().next_deadline() {
                timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
            }
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            self.clients.take_events(&events);
            self.own_events(now);
            self.clients.turn(&mut self.poll, &mut events, now);
            if let Some(error) = self.clients.take_fatal() {
                // What reached the disk is unknown: going on could
                // acknowledge what a restart loses.
                return Err(io::Error::new(error.kind(), format!("the Raft log could not be synced: {error}")));
            }
            // Those that came while the turn waited for searches.
            self.own_events(now);
            if now >= next_sweep {
                self.clients.sweep(now, idle, request);
                self.clients.app().sweep(now);
                self.clients.app().release_memory();
                next_sweep = now + sweep_interval;
            }
            if let Some(deadline) = self.shutdown_deadline {
                self.clients.close_idle();
                if self.clients.is_empty() || now >= deadline {
                    self.clients.app().shutdown();
                    log::info("shut_down", format_args!("shut down ({} connections cut off)", self.clients.len()));
                    return Ok(());
                }
            }
        }
    }

    /// Accepts and handles signals, as the events of the server's own tokens ask.
    fn own_events(&mut self, now: Instant) {
        let (mut accept, mut signal) = (false, false);
        for token in self.clients.take_own_events() {
            accept |= token == LISTENER;
            signal |= token == SIGNALS;
        }
        if accept {
            self.accept(now);
        }
        if signal {
            self.on_signal(now);
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
                    log::warn("accept_failed", format_args!("accept failed: {e}"));
                    return;
                }
            };
            let open = self.clients.len();
            if open >= self.config.connections_max {
                // A best-effort answer on a fresh socket, whose buffer takes
                // it whole (over TLS, the close alone: there is no session
                // to answer in).
                if self.config.tls_cert.is_none() {
                    let mut reply = Vec::new();
                    ApiError::TooManyConnections.write(&mut reply, false);
                    let _ = socket.write(&reply);
                }
                self.clients.app().metrics().connection_refused();
                log::client_warning(
                    "connection_refused",
                    now,
                    format_args!("{peer}: refused, {open} connections are open (--connections-max)"),
                );
                continue;
            }
            let _ = socket.set_nodelay(true);
            match self.clients.add(socket, peer, now) {
                Ok(_) => self.clients.app().metrics().connection_accepted(),
                Err(e) => log::warn("register_failed", format_args!("cannot register a connection: {e}")),
            }
        }
    }

    fn on_signal(&mut self, now: Instant) {
        if self.signals.pending().next().is_some() && self.shutdown_deadline.is_none() {
            log::info("shutting_down", format_args!("shutting down: answering requests in flight"));
            let _ = self.poll.registry().deregister(&mut self.listener);
            self.clients.shut_down();
            self.shutdown_deadline = Some(now + Duration::from_millis(SHUTDOWN_DRAIN_MS));
        }
    }
}

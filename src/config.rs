//! Command-line flags, turned into the `Config` the server runs with.
//!
//! Every flag can also come from the environment (`QUIVER_` and the flag's
//! name in capitals, `_` for `-`: `--port` is `QUIVER_PORT`) and from a TOML
//! file (`--config`, keys named as the flags, without their dashes in
//! front). A flag beats the environment, which beats the file, which beats
//! the default.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::TypedValueParser;
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches};

use crate::limits;
use crate::store::cpu::Simd;

/// quiver: a vector database server with exact k-nearest-neighbour search.
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "quiver", version, about)]
pub struct Config {
    /// A TOML file of settings, named as the flags (`port = 9000`,
    /// `data-dir = "/srv/quiver"`); flags and the environment beat it.
    #[arg(long)]
    pub config: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,

    /// Port to listen on (0 picks a free port; the log says which).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Directory holding the data and the API key file.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,

    /// API key clients must send in X-Service-API-Key. Default: $QUIVER_API_KEY,
    /// else the key in `<data-dir>/api_key.txt`, else a newly generated one.
    #[arg(long, hide_env_values = true)]
    pub api_key: Option<String>,

    /// A second API key, which may search, retrieve, scroll, read stats and
    /// metrics and list indexes; every write with it is answered 403.
    #[arg(long, hide_env_values = true)]
    pub read_only_api_key: Option<String>,

    /// Serve HTTPS only, with this certificate chain (PEM) and the key of --tls-key
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert, PEM (PKCS #8, PKCS #1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Largest request body in bytes, at most 1 GiB (larger: 413).
    #[arg(long, default_value_t = limits::BODY_BYTES_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=limits::BODY_BYTES_CEILING as u64).map(|n| n as usize))]
    pub body_bytes_max: usize,

    /// Largest request head (request line and headers) in bytes (larger: 431).
    #[arg(long, default_value_t = limits::HEAD_BYTES_MAX_DEFAULT)]
    pub head_bytes_max: usize,

    /// Most header fields in a request (more: 431).
    #[arg(long, default_value_t = limits::HEADERS_COUNT_MAX_DEFAULT,
          value_parser = clap::value_parser!(u16).range(1..=limits::HEADERS_COUNT_CEILING as i64).map(usize::from))]
    pub headers_max: usize,

    /// Most chunks in a chunked request body (more: 413).
    #[arg(long, default_value_t = limits::CHUNKS_MAX_DEFAULT)]
    pub chunks_max: usize,

    /// Largest chunk of a chunked request body, in bytes (larger: 413).
    #[arg(long, default_value_t = limits::CHUNK_BYTES_MAX_DEFAULT)]
    pub chunk_bytes_max: usize,

    /// Requests handled for one connection per turn of the loop before the others get theirs.
    #[arg(long, default_value_t = limits::REQUESTS_PER_TICK_MAX_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub requests_per_tick_max: usize,

    /// Most ids (retrieve, delete) or embeddings (insert, upsert) in one request (more: 400).
    #[arg(long, default_value_t = limits::ITEMS_PER_REQUEST_MAX_DEFAULT)]
    pub items_max: usize,

    /// Most metadata entries of one embedding (more: 400).
    #[arg(long, default_value_t = limits::METADATA_ENTRIES_MAX_DEFAULT)]
    pub metadata_entries_max: usize,

    /// Largest metadata of one embedding, in bytes of its JSON text (larger: 400).
    #[arg(long, default_value_t = limits::METADATA_BYTES_MAX_DEFAULT)]
    pub metadata_bytes_max: usize,

    /// Most indexes (more: 500 INDEX_NOT_CREATED).
    #[arg(long, default_value_t = limits::INDEXES_MAX_DEFAULT)]
    pub indexes_max: usize,

    /// Longest index name, 3 to 32 (longer: 500 INDEX_NOT_CREATED).
    #[arg(long, default_value_t = limits::INDEX_NAME_BYTES_MAX,
          value_parser = clap::value_parser!(u8).range(limits::INDEX_NAME_BYTES_MIN as i64..=limits::INDEX_NAME_BYTES_MAX as i64).map(usize::from))]
    pub index_name_bytes_max: usize,

    /// Most open client connections (more: 503 and closed).
    #[arg(long, default_value_t = limits::CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,

    /// Close a connection idle this long, in milliseconds.
    #[arg(long, default_value_t = limits::IDLE_TIMEOUT_MS_DEFAULT)]
    pub idle_timeout_ms: u64,

    /// Answer 408 and close when a request is not complete after this long, in milliseconds.
    #[arg(long, default_value_t = limits::REQUEST_TIMEOUT_MS_DEFAULT)]
    pub request_timeout_ms: u64,

    /// Largest vector dimensionality an index may be created with, at most 1,048,576.
    #[arg(long, default_value_t = limits::DIMENSIONS_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=limits::DIMENSIONS_CEILING as u64).map(|n| n as usize))]
    pub dimensions_max: usize,

    /// Largest reply one request may produce, in bytes, at least 65,536 (larger: 400
    /// REPLY_TOO_LARGE, saying how many ids or hits fit).
    #[arg(long, default_value_t = limits::REPLY_BYTES_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(limits::REPLY_BYTES_FLOOR as u64..=u32::MAX as u64).map(|n| n as usize))]
    pub reply_bytes_max: usize,

    /// Largest k a search may ask for.
    #[arg(long, default_value_t = limits::K_MAX_DEFAULT)]
    pub k_max: usize,

    /// Most searches in one search-batch request.
    #[arg(long, default_value_t = limits::SEARCH_BATCH_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|n| n as usize))]
    pub search_batch_max: usize,

    /// Most levels of $and, $or and $not inside one another in a filter.
    #[arg(long, default_value_t = limits::FILTER_DEPTH_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=64).map(|n| n as usize))]
    pub filter_depth_max: usize,

    /// Most terms in a filter: operators, keys, and the values of $in and $nin.
    #[arg(long, default_value_t = limits::FILTER_TERMS_MAX_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000).map(|n| n as usize))]
    pub filter_terms_max: usize,

    /// Write a snapshot (in a forked process) once the log has grown this many bytes.
    #[arg(long, default_value_t = limits::SNAPSHOT_LOG_BYTES_DEFAULT)]
    pub snapshot_log_bytes: u64,

    /// Send a snapshot download at most this many bytes a second, so that writes and
    /// searches keep their share of the CPU meanwhile; 0 sends as fast as the client
    /// takes it. Otherwise at least 2,000,000.
    #[arg(long, default_value_t = limits::SNAPSHOT_DOWNLOAD_BYTES_PER_S_DEFAULT, value_parser = download_rate)]
    pub snapshot_download_bytes_per_s: u64,

    /// If the log is damaged before its end, cut it there (dropping every record after
    /// the damage) instead of refusing to start.
    #[arg(long)]
    pub repair_log: bool,

    /// For measurements only: skip fdatasync. Answered writes then survive a crash of
    /// the process but not of the machine.
    #[arg(long)]
    pub unsafe_no_sync: bool,

    /// Serve GET /metrics without the API key (for a Prometheus that cannot send it).
    #[arg(long)]
    pub metrics_public: bool,

    /// Which SIMD instructions the f32 kernels use: auto picks the widest this CPU has
    /// (the log says which). The others are for measurements and tests.
    #[arg(long, value_enum, default_value_t = SimdFlag::Auto)]
    pub simd: SimdFlag,

    /// Score every row of a lone search in f32, without the int8 first pass (for
    /// measurements and tests: the answers are the same).
    #[arg(long)]
    pub no_int8_pass: bool,

    /// Threads that scan a large index, the loop's own among them: a pool started
    /// once (a scan uses at most 8). Default: this machine's cores.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256).map(usize::from))]
    pub scan_threads: Option<usize>,

    /// How much to log.
    #[arg(long, value_enum, default_value_t = crate::log::Level::Info)]
    pub log_level: crate::log::Level,

    /// How log lines look: text, or json (one object a line: time, level,
    /// event, message).
    #[arg(long, value_enum, default_value_t = crate::log::Format::Text)]
    pub log_format: crate::log::Format,

    /// This node's id in a cluster, 1 to 2^31. With --peer-addr it makes this server a
    /// cluster node, whose writes go through the cluster's Raft log.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 31)))]
    pub node_id: Option<u64>,

    /// HOST:PORT where this node listens for the other nodes (its outgoing peer
    /// connections leave from HOST too).
    #[arg(long)]
    pub peer_addr: Option<String>,

    /// The first voting members of a new cluster, this node included:
    /// 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT. Read only when the data directory holds no
    /// cluster state yet; without it an empty node waits until a member adds it.
    #[arg(long, value_delimiter = ',')]
    pub initial_peers: Vec<String>,

    /// The secret every node of the cluster shares; peer connections prove they
    /// know it without sending it. Required in a cluster.
    #[arg(long, hide_env_values = true)]
    pub cluster_secret: Option<String>,

    /// How long a write waits to be committed, or a read to be confirmed, before it
    /// is answered 503 CLUSTER_UNAVAILABLE, in milliseconds.
    #[arg(long, default_value_t = limits::CLUSTER_TIMEOUT_MS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub cluster_timeout_ms: u64,
}

/// Why the settings could not be read: clap's own errors (which also
/// carry `--help` and `--version`) print and exit as clap does.
#[derive(Debug)]
pub enum ConfigError {
    Flags(clap::Error),
    File(String),
}

/// The environment variable of the flag `--long`.
pub fn env_name(long: &str) -> String {
    format!("QUIVER_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// The flags, each with its environment variable.
pub fn command() -> clap::Command {
    Config::command().mut_args(|arg| match arg.get_long().map(env_name) {
        Some(name) => arg.env(name),
        None => arg,
    })
}

impl Config {
    /// The settings from `args` (the program's name first), the
    /// environment, and the `--config` file if one is named.
    pub fn load<I: IntoIterator<Item = OsString>>(args: I) -> Result<Config, ConfigError> {
        let args: Vec<OsString> = args.into_iter().collect();
        let command = command();
        let matches = command.clone().try_get_matches_from(&args).map_err(ConfigError::Flags)?;
        let Some(path) = matches.get_one::<PathBuf>("config") else {
            return Config::from_arg_matches(&matches).map_err(ConfigError::Flags);
        };
        // The file's settings become flags in front of the given ones, each
        // only where neither a flag nor the environment set it.
        let from_file = file_flags(&command, &matches, path).map_err(ConfigError::File)?;
        let mut all = Vec::with_capacity(args.len() + from_file.len());
        all.extend(args.first().cloned());
        all.extend(from_file.into_iter().map(OsString::from));
        all.extend(args.into_iter().skip(1));
        // The given flags parsed once already: what fails now is the file's.
        let in_file = |error: clap::Error| {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or_default();
            ConfigError::File(format!("--config {}: {}", path.display(), first.trim_start_matches("error: ")))
        };
        let matches = command.try_get_matches_from(all).map_err(in_file)?;
        Config::from_arg_matches(&matches).map_err(in_file)
    }

    /// The cluster this node belongs to, from the cluster flags; none
    /// without them. An error says which flag is missing or wrong.
    pub fn cluster(&self) -> Result<Option<crate::cluster::replica::Settings>, String> {
        let (node_id, peer_addr) = match (self.node_id, &self.peer_addr) {
            (None, None) if self.initial_peers.is_empty() => return Ok(None),
            (Some(id), Some(address)) => (id, address),
            _ => return Err("a cluster node needs both --node-id and --peer-addr".to_owned()),
        };
        let peer_addr = resolve_peer(peer_addr).map_err(|e| format!("--peer-addr {peer_addr}: {e}"))?;
        let secret = match &self.cluster_secret {
            Some(secret) if !secret.is_empty() => secret.clone(),
            _ => return Err("a cluster node needs --cluster-secret (or QUIVER_CLUSTER_SECRET)".to_owned()),
        };
        let mut initial_peers = Vec::new();
        for member in self.initial_peers.iter().filter(|member| !member.is_empty()) {
            let bad = |why: &str| format!("--initial-peers: '{member}' is not ID=HOST:PORT ({why})");
            let (id, address) = member.split_once('=').ok_or_else(|| bad("no '='"))?;
            let id: u64 = id.trim().parse().map_err(|_| bad("the id is not a number"))?;
            if !(1..=1 << 31).contains(&id) {
                return Err(bad("ids are 1 to 2^31"));
            }
            let address = resolve_peer(address.trim()).map_err(|e| bad(&e))?;
            if initial_peers.iter().any(|&(other, _)| other == id) {
                return Err(bad("the id appears twice"));
            }
            initial_peers.push((id, address));
        }
        if !initial_peers.is_empty() && !initial_peers.iter().any(|&(id, _)| id == node_id) {
            return Err(format!("--initial-peers must include this node ({node_id})"));
        }
        Ok(Some(crate::cluster::replica::Settings {
            node_id,
            peer_addr,
            initial_peers,
            secret,
            timeout: std::time::Duration::from_millis(self.cluster_timeout_ms),
            snapshot_log_bytes: self.snapshot_log_bytes,
        }))
    }
}

/// A download's rate: 0 (as fast as the client takes it) or at least
/// twice the rate below which a download is cut off as stalled, so that
/// pacing alone never makes it that slow.
fn download_rate(text: &str) -> Result<u64, String> {
    let rate: u64 = text.parse().map_err(|error| format!("{error}"))?;
    let floor = 2 * limits::SNAPSHOT_SEND_RATE_MIN_BYTES;
    if rate != 0 && rate < floor {
        return Err(format!("0 (no limit) or at least {floor} bytes a second"));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_download_rate_is_none_or_past_its_floor() {
        for (text, rate) in [("0", Some(0)), ("2000000", Some(2_000_000)), ("700000000", Some(700_000_000))] {
            assert_eq!(super::download_rate(text).ok(), rate, "{text}");
        }
        for text in ["1", "1999999", "-1", "fast", ""] {
            assert!(super::download_rate(text).is_err(), "{text}");
        }
    }
}

/// The flags that a TOML file's settings stand for, leaving out those a
/// flag or the environment set; an error names the file, the key and what
/// is wrong with it.
fn file_flags(command: &clap::Command, matches: &clap::ArgMatches, path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let table: toml::Table = text.parse().map_err(|e| format!("--config {}: not TOML: {e}", path.display()))?;
    let settable = || command.get_arguments().filter(|arg| arg.get_long().is_some_and(|long| long != "config"));
    let mut flags = Vec::new();
    for (key, value) in table {
        let bad = |why: String| format!("--config {}: '{key}': {why}", path.display());
        let long = key.replace('_', "-");
        let Some(arg) = settable().find(|arg| arg.get_long() == Some(long.as_str())) else {
            let known = settable().filter_map(|arg| arg.get_long());
            let near = known.max_by(|a, b| strsim::jaro(a, &long).total_cmp(&strsim::jaro(b, &long)));
            let hint =
                near.filter(|near| strsim::jaro(near, &long) > 0.8).map(|near| format!(" (did you mean '{near}'?)"));
            return Err(bad(format!("no such setting{}", hint.unwrap_or_default())));
        };
        if matches!(
            matches.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            match value {
                toml::Value::Boolean(true) => flags.push(format!("--{long}")),
                toml::Value::Boolean(false) => {}
                _ => return Err(bad("expected true or false".to_owned())),
            }
            continue;
        }
        let values = match value {
            toml::Value::Array(values) if matches!(arg.get_action(), ArgAction::Append) => values,
            value => vec![value],
        };
        for value in values {
            let text = match value {
                toml::Value::String(text) => text,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => return Err(bad(format!("expected a string or a number, not {}", other.type_str()))),
            };
            flags.push(format!("--{long}={text}"));
        }
    }
    Ok(flags)
}

/// The one address `HOST:PORT` names.
fn resolve_peer(address: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    address.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or_else(|| "names no address".to_owned())
}

/// `--simd`'s values: the store's `Simd`, named for the command line here,
/// so that the store knows nothing of clap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SimdFlag {
    /// The widest this CPU has.
    Auto,
    /// AVX-512F: 16 lanes, fused multiply-adds.
    Avx512,
    /// AVX2 and FMA: 8 lanes, fused multiply-adds.
    Avx2,
    /// What every x86-64 has (SSE2), or the target's baseline elsewhere.
    Baseline,
}

impl From<SimdFlag> for Simd {
    fn from(flag: SimdFlag) -> Simd {
        match flag {
            SimdFlag::Auto => Simd::Auto,
            SimdFlag::Avx512 => Simd::Avx512,
            SimdFlag::Avx2 => Simd::Avx2,
            SimdFlag::Baseline => Simd::Baseline,
        }
    }
}

//! Starts the real `quiver` binary on a free port with a temporary data
//! directory, and talks to it with a small raw-TCP HTTP client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const KEY: &str = "test-key-0123456789";

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The start-up log line, for tests that read it.
    pub log_line: String,
    /// Everything the server has logged so far.
    log: Arc<Mutex<String>>,
    dir: Option<tempfile::TempDir>,
    data_dir: PathBuf,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts with the test key and extra flags.
    pub fn start_with(extra: &[&str]) -> Server {
        let mut args = vec!["--api-key", KEY];
        args.extend_from_slice(extra);
        Server::start_raw(&args, &[])
    }

    /// Starts with exactly these flags and environment (plus host, port and data directory).
    pub fn start_raw(args: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("temporary directory");
        let data_dir = dir.path().join("data");
        Server::start_in(Some(dir), data_dir, args, env)
    }

    pub fn start_in(dir: Option<tempfile::TempDir>, data_dir: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command.args(["--host", "127.0.0.1", "--port", "0", "--data-dir"]).arg(&data_dir).args(args);
        command.env_remove("QUIVER_API_KEY");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("start quiver");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut log_line = String::new();
        let mut earlier = String::new();
        loop {
            log_line.clear();
            if stderr.read_line(&mut log_line).unwrap() == 0 {
                panic!("quiver exited before listening: {:?}\n{earlier}", child.wait());
            }
            if log_line.contains("listening on ") {
                break;
            }
            earlier.push_str(&log_line);
        }
        let addr = log_line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        earlier.push_str(&log_line);
        let log = Arc::new(Mutex::new(earlier));
        // Keep draining the log so the server never blocks on a full pipe.
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut line = String::new();
            while stderr.read_line(&mut line).unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Server { child, addr, log_line, log, dir, data_dir }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log contains `text`.
    pub fn wait_for_log(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(text) {
            assert!(Instant::now() < deadline, "no {text:?} in the log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn connect(&self) -> Client {
        Client::connect(self.addr)
    }

    /// One request on a fresh connection, with the test key.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.connect().call(method, path, body)
    }

    /// One value from /metrics, 0 when it is absent.
    pub fn metric(&self, name: &str) -> f64 {
        let mut client = self.connect();
        client.send(&request_bytes("GET", "/metrics", &[("X-Service-API-Key", KEY), ("Connection", "close")], None));
        let mut text = String::new();
        client.stream.read_to_string(&mut text).expect("read /metrics");
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).map_or(0.0, |v| v.parse().unwrap())
    }

    /// A figure of the server process in KiB from /proc: `VmRSS` (resident
    /// now) or `VmHWM` (its peak).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'));
        line.and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("{field} in {status}"))
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: signals our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        self.dir.take();
        status
    }
}

/// Runs the server on `data_dir` (on `127.0.0.1:port`), expects it to refuse
/// to start (exit status 1), and returns what it said on standard error.
pub fn start_fails(data_dir: &Path, port: &str, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["--host", "127.0.0.1", "--port", port, "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Value,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn detail(&self) -> &str {
        self.body["error"]["detail"].as_str().unwrap_or("")
    }

    /// Asserts the envelope is consistent with the HTTP status.
    pub fn check_envelope(&self) {
        assert_eq!(self.body["status"].as_u64(), Some(u64::from(self.status)), "{self:?}");
        assert!(self.body["message"].is_string(), "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/json"), "{self:?}");
        if self.status >= 400 {
            assert!(self.body["error"]["code"].is_string(), "{self:?}");
            assert!(
                self.body["error"]["description"].is_string() || self.body["error"]["description"].is_array(),
                "{self:?}"
            );
        }
    }
}

pub struct Client {
    pub stream: TcpStream,
    buffered: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.set_nodelay(true).unwrap();
        Client { stream, buffered: Vec::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// A request with the test key and a Content-Length body.
    pub fn call(&mut self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.call_with(method, path, &[("X-Service-API-Key", KEY)], body)
    }

    pub fn call_with(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Response {
        self.send(&request_bytes(method, path, headers, body));
        self.read_response()
    }

    /// Reads one response (skipping any 100 Continue).
    pub fn read_response(&mut self) -> Response {
        loop {
            let response = self.read_one();
            if response.status != 100 {
                return response;
            }
        }
    }

    fn read_one(&mut self) -> Response {
        let (status, head, body_bytes) = self.read_frame();
        let body = if body_bytes.is_empty() { Value::Null } else { serde_json::from_slice(&body_bytes).unwrap() };
        Response { status, head, body }
    }

    /// Sends a request built beforehand (`request_bytes`) and returns the
    /// status of its response, leaving the body unparsed: a load
    /// generator's call, as cheap as it can be, since it runs on the cores
    /// the server uses. (The load bench's: the tests read whole answers.)
    #[allow(dead_code)]
    pub fn status_of(&mut self, request: &[u8]) -> u16 {
        self.send(request);
        loop {
            let (status, _, _) = self.read_frame();
            if status != 100 {
                return status;
            }
        }
    }

    /// Sends a request and returns its response's status and body bytes,
    /// unparsed (the bench reading large replies at speed).
    #[allow(dead_code)]
    pub fn raw_call(&mut self, method: &str, path: &str, body: Option<&str>) -> (u16, Vec<u8>) {
        self.send(&request_bytes(method, path, &[("X-Service-API-Key", KEY)], body));
        let (status, _, body) = self.read_frame();
        (status, body)
    }

    /// A request with a body of any bytes; its response's status, head and
    /// body bytes, unparsed (snapshot images go both ways).
    pub fn call_bytes(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String, Vec<u8>) {
        self.send(&request_with_bytes(method, path, headers, Some(body)));
        self.read_frame()
    }

    /// Reads one response's status, head and body bytes.
    pub fn read_frame(&mut self) -> (u16, String, Vec<u8>) {
        read_frame(&mut self.stream, &mut self.buffered)
    }

    /// True when the server closed the connection (EOF or reset, with nothing
    /// more sent); false when it stays open and silent for a moment.
    pub fn is_closed(&mut self) -> bool {
        if !self.buffered.is_empty() {
            return false;
        }
        self.stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let closed = match self.stream.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        };
        self.stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        closed
    }
}

/// Reads one response's status, head and body bytes from `source` (a
/// socket, or a TLS stream), keeping what follows it in `buffered`.
pub fn read_frame(source: &mut impl Read, buffered: &mut Vec<u8>) -> (u16, String, Vec<u8>) {
    let mut fill = |buffered: &mut Vec<u8>| {
        let mut chunk = [0u8; 65536];
        let n = source.read(&mut chunk).expect("read from quiver");
        buffered.extend_from_slice(&chunk[..n]);
        n
    };
    let head_end = loop {
        if let Some(at) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        assert!(fill(buffered) > 0, "connection closed before a response: {:?}", String::from_utf8_lossy(buffered));
    };
    let head = String::from_utf8(buffered[..head_end].to_vec()).unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")))
        .map(|(_, v)| v.trim().parse().unwrap())
        .unwrap_or(0);
    while buffered.len() < head_end + length {
        assert!(fill(buffered) > 0, "connection closed inside a response body");
    }
    let body: Vec<u8> = buffered.drain(..head_end + length).skip(head_end).collect();
    (status, head, body)
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Vec<u8> {
    request_with_bytes(method, path, headers, body.map(str::as_bytes))
}

/// A request whose body is any bytes.
pub fn request_with_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Vec<u8> {
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        text.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    text.push_str("\r\n");
    let mut bytes = text.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// splitmix64, for reproducible test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn float(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Creates an index, asserting success.
pub fn create_index(server: &Server, name: &str, dims: usize, metric: &str) {
    let r = server.call(
        "PUT",
        &format!("/api/v1/indexes/{name}/create"),
        Some(&format!(r#"{{"dimensions":{dims},"metric":"{metric}"}}"#)),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// The API in-process, with its data in `data_dir` (unsynced) and the
/// test key: for tests that drive turns of the loop by hand.
pub fn app_in(data_dir: &Path) -> quiver::api::App {
    use quiver::api::{decode::BodyLimits, ApiLimits, App};
    use quiver::db::{Database, Options};
    let options =
        Options { data_dir: data_dir.to_owned(), snapshot_log_bytes: u64::MAX, repair_log: false, sync: false };
    let limits = ApiLimits {
        dimensions_max: 1024,
        k_max: 100,
        search_batch_max: 64,
        reply_bytes_max: quiver::limits::REPLY_BYTES_MAX_DEFAULT,
        body: BodyLimits::DEFAULT,
        indexes_max: 8,
        index_name_bytes_max: 32,
        metrics_public: false,
    };
    App::new(Database::open(&options).unwrap(), KEY.to_owned(), limits)
}

/// Records, as the unit tests' `testing::skip` does, that `test` did not
/// run here because of `why`; `make test` lists such lines at its end.
pub fn skip(test: &str, why: &str) {
    let line = format!("skipped: {test} ({why})\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    if let Some(path) = std::env::var_os("QUIVER_SKIPPED_TESTS") {
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = std::io::Write::write_all(&mut file, line.as_bytes());
        }
    }
}

/// `count` random vectors of `dims` values, as JSON arrays (the benches' bodies).
#[allow(dead_code)]
pub fn vector_texts(rng: &mut Rng, count: usize, dims: usize) -> Vec<String> {
    (0..count)
        .map(|_| {
            let values: Vec<String> = (0..dims).map(|_| rng.float().to_string()).collect();
            format!("[{}]", values.join(","))
        })
        .collect()
}

/// `{"embeddings":[...]}` for ids `first..first+count`, vectors taken in turn from `texts`.
#[allow(dead_code)]
pub fn batch_body(first: usize, count: usize, texts: &[String]) -> String {
    let mut body = String::with_capacity(count * (texts[0].len() + 24) + 20);
    body.push_str(r#"{"embeddings":["#);
    for i in 0..count {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(r#"{{"id":{},"data":"#, first + i));
        body.push_str(&texts[(first + i) % texts.len()]);
        body.push('}');
    }
    body.push_str("]}");
    body
}

#[allow(dead_code)]
/// The user and kernel CPU seconds of process `pid` (all its threads) so far.
pub fn cpu_seconds(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields 14 and 15 (utime, stime), counted after the parenthesised name.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..].split(' ').collect();
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let field = |i: usize| fields[i - 3].parse::<f64>().expect("a tick count") / ticks;
    (field(14), field(15))
}

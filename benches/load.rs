//! The end-to-end load benchmark: starts the release server, loads the
//! indexes of the performance targets over HTTP, and for each target prints
//! our figure, the reference figure measured in the same run, and the ratio.
//! The table is also written to `target/load-bench.md`.
//!
//! The wrk-against-nginx rows need both tools (`apt-get install wrk
//! nginx-light` on Debian); without them those rows say so and are skipped.
//!
//! Run with `make bench` (or `cargo bench --bench load`; `cargo bench
//! --bench load -- small` runs only the wrk rows).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::{cpu_seconds, create_index, Rng, Server, KEY};

const WIDE_DIMS: usize = 768;
const WIDE_ROWS: usize = 100_000;
const BATCH: usize = 1_000;
/// Target 2: rounds of one client then 32, each measured for
/// `SEARCH_MEASURED` after `SEARCH_WARM_UP`. Within one run, single rounds
/// have ranged over 0.7-1.15 of their median, so the median takes five.
const SEARCH_ROUNDS: usize = 5;
const SEARCH_WARM_UP: Duration = Duration::from_millis(500);
const SEARCH_MEASURED: Duration = Duration::from_secs(2);

/// One line of the table.
struct Row {
    target: String,
    ours: String,
    reference: String,
    /// ours / reference, and the goal for it.
    ratio: Option<f64>,
    goal: &'static str,
}

#[derive(Default)]
struct Table(Vec<Row>);

impl Table {
    fn add(&mut self, target: &str, ours: String, reference: String, ratio: Option<f64>, goal: &'static str) {
        let row = Row { target: target.into(), ours, reference, ratio, goal };
        println!(
            "  {}: {} | reference {} | ratio {} (goal {})",
            row.target,
            row.ours,
            row.reference,
            row.ratio.map_or("-".into(), |r| format!("{r:.2}")),
            row.goal
        );
        self.0.push(row);
    }

    fn markdown(&self) -> String {
        let mut text = String::from("| target | ours | reference, same run | ratio | goal |\n|---|---|---|---|---|\n");
        for row in &self.0 {
            let ratio = row.ratio.map_or("-".into(), |r| format!("{r:.2}"));
            writeln!(text, "| {} | {} | {} | {} | {} |", row.target, row.ours, row.reference, ratio, row.goal).unwrap();
        }
        text
    }
}

fn main() {
    // `cargo bench` passes flags such as `--bench`; other arguments choose
    // sections: `wide` (targets 4, 1, 2), `small` (3), `memory` (5).
    let chosen: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |section: &str| chosen.is_empty() || chosen.iter().any(|c| section.contains(c.as_str()));
    let mut table = Table::default();
    println!("load (release server, loopback; ratios are ours / reference)");
    {
        let server = Server::start();
        if run("wide") {
            ingest_and_search(&server, &mut table);
        }
        if run("small") {
            small_requests(&server, &mut table);
        }
    }
    if run("memory") {
        memory(&mut table);
    }
    let out = Path::new("target/load-bench.md");
    std::fs::write(out, format!("{}\n\n{}", stamp(), table.markdown())).expect("write target/load-bench.md");
    println!("table written to {}", out.display());
}

/// When, from what and where the table was measured: the date (UTC), the
/// commit (`-dirty` with uncommitted changes), the CPU, its cores and memory.
fn stamp() -> String {
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or_else(|| "unknown".to_owned(), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let date = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let commit = output("git", &["rev-parse", "--short=12", "HEAD"]);
    let dirty =
        if output("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty() { "" } else { "-dirty" };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map_or("unknown CPU", |l| l.trim_start_matches([' ', '\t', ':']));
    let features: Vec<&str> = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"]
        .into_iter()
        .filter(|f| cpuinfo.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == *f)))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "`make bench` of {date}, commit {commit}{dirty}, on {cpu} ({}), {cores} cores, {:.0} GiB",
        features.join(", "),
        memory_kib as f64 / (1 << 20) as f64
    )
}

fn vector_text(rng: &mut Rng, dims: usize, out: &mut String) {
    out.push('[');
    for d in 0..dims {
        if d > 0 {
            out.push(',');
        }
        write!(out, "{}", rng.float()).unwrap();
    }
    out.push(']');
}

/// `count` random vectors as JSON arrays.
fn vector_texts(rng: &mut Rng, count: usize, dims: usize) -> Vec<String> {
    (0..count)
        .map(|_| {
            let mut text = String::new();
            vector_text(rng, dims, &mut text);
            text
        })
        .collect()
}

fn search_body(rng: &mut Rng, dims: usize) -> String {
    let mut body = String::from(r#"{"k":10,"queryVector":"#);
    vector_text(rng, dims, &mut body);
    body.push('}');
    body
}

/// An insert body of `BATCH` embeddings from `first_id` on, each with short
/// metadata, its vectors taken in turn from `texts`.
fn insert_body(texts: &[String], first_id: usize) -> String {
    let mut body = String::from(r#"{"embeddings":["#);
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        write!(body, r#"{{"id":{},"metadata":{{"n":"{}"}},"data":{text}}}"#, first_id + i, first_id + i).unwrap();
    }
    body.push_str("]}");
    body
}

/// Inserts `rows` embeddings of `dims` into `index`, `BATCH` per request:
/// ten batches of fresh random vectors, then those vectors again under new
/// ids. Returns how long each of the first ten took, and one body's size.
fn load(server: &Server, index: &str, dims: usize, rows: usize, rng: &mut Rng) -> (Vec<Duration>, usize) {
    let texts = vector_texts(rng, BATCH * 10, dims);
    let path = format!("/api/v1/embeddings/{index}/insert");
    let mut client = server.connect();
    let (mut fresh, mut bytes) = (Vec::new(), 0);
    for batch in 0..rows / BATCH {
        let first = (batch % 10) * BATCH;
        let body = insert_body(&texts[first..first + BATCH], batch * BATCH);
        // Built before the clock starts, like the searches' requests: what
        // is timed is the server's ingest, not the copy of a body into a
        // fresh request.
        let request = harness::request_bytes("PUT", &path, &[("X-Service-API-Key", KEY)], Some(&body));
        let started = Instant::now();
        let status = client.status_of(&request);
        assert_eq!(status, 200, "insert {batch}");
        if batch < 10 {
            fresh.push(started.elapsed());
            bytes = body.len();
        }
    }
    (fresh, bytes)
}

/// The middle of `samples` in the order `compare` gives.
fn median<T: Copy>(samples: &mut [T], compare: impl FnMut(&T, &T) -> std::cmp::Ordering) -> T {
    samples.sort_by(compare);
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Targets 4, 1 and 2 on a 100,000 x 768 cosine index.
fn ingest_and_search(server: &Server, table: &mut Table) {
    create_index(server, "wide", WIDE_DIMS, "cosine");
    let mut client = server.connect();
    let mut rng = Rng(7);

    // Ingest: the first ten batches, each of fresh vectors, are timed.
    let (mut inserts, bytes) = load(server, "wide", WIDE_DIMS, WIDE_ROWS, &mut rng);
    let insert = median(&mut inserts, Duration::cmp);
    let mb_per_s = bytes as f64 / 1e6 / insert.as_secs_f64();
    table.add(
        "4. ingest, 1,000 x 768 per insert, durability on (median of 10)",
        format!("{mb_per_s:.0} MB/s ({:.0} vectors/s, {})", BATCH as f64 / insert.as_secs_f64(), ms(insert)),
        "200 MB/s".into(),
        Some(mb_per_s / 200.0),
        ">= 1",
    );

    // A lone search against the memory-read floor for the same bytes.
    let floor = memory_floor(WIDE_ROWS * WIDE_DIMS, 1);
    let floor_two = memory_floor(WIDE_ROWS * WIDE_DIMS, 2);
    let mut searches = Vec::new();
    for _ in 0..30 {
        let body = search_body(&mut rng, WIDE_DIMS);
        let started = Instant::now();
        let r = client.call("POST", "/api/v1/embeddings/wide/search", Some(&body));
        searches.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
    }
    let search = median(&mut searches, Duration::cmp);
    table.add(
        "1. search 100,000 x 768 cosine, k=10, one client (median of 30)",
        ms(search),
        format!("memory-read floor, 1 thread: {} (2 threads: {})", ms(floor), ms(floor_two)),
        Some(search.as_secs_f64() / floor.as_secs_f64()),
        "<= 1.1; 0.65 with 2 cores",
    );

    // 32 clients searching at once, against one client, in alternating
    // rounds: the host's noise comes in spells of a second or more, so each
    // round's two figures are taken seconds apart, and the median round's
    // ratio is the figure.
    let queries: Vec<String> = (0..32).map(|_| search_body(&mut rng, WIDE_DIMS)).collect();
    let mut rounds = Vec::new();
    for _ in 0..SEARCH_ROUNDS {
        let single = searches_per_second(server.addr, &queries[..1]);
        let before = batch_counters(server);
        let concurrent = searches_per_second(server.addr, &queries);
        let after = batch_counters(server);
        let batches = (after.1 - before.1).max(1.0);
        let per_batch = (after.0 - before.0) / batches;
        let waiting_ms = (after.2 - before.2) * 1e3 / batches;
        rounds.push((concurrent / single, single, concurrent, per_batch, waiting_ms));
    }
    // `median` leaves the rounds sorted, for the list of their ratios.
    let (ratio, single, concurrent, per_batch, waiting_ms) = median(&mut rounds, |a, b| a.0.total_cmp(&b.0));
    let ratios: Vec<String> = rounds.iter().map(|r| format!("{:.2}", r.0)).collect();
    table.add(
        "2. searches/s, 100,000 x 768 cosine, k=10, 32 clients (median of 5 rounds of 2 s)",
        format!(
            "{concurrent:.0}/s ({per_batch:.1} searches per batch, {waiting_ms:.2} ms waiting for them per batch; \
             rounds {})",
            ratios.join(", ")
        ),
        format!("1 client: {single:.0}/s"),
        Some(ratio),
        ">= 10",
    );

    // The first pass's products a second at 32 clients (every
    // row's 768 products for each search), against the CPU's int8 peak
    // measured here.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match int8_peak(threads) {
        Some((peak, isa)) => {
            let products = concurrent * (WIDE_ROWS * WIDE_DIMS) as f64;
            table.add(
                "int8 products/s of the first pass, 100,000 x 768 cosine, 32 clients",
                format!("{:.1} G/s", products / 1e9),
                format!("{isa} peak, {threads} threads: {:.1} G/s", peak / 1e9),
                Some(products / peak),
                ">= 0.5",
            );
        }
        None => println!("  int8 peak: skipped, this CPU has no int8 product instructions"),
    }
}

/// Searches batched, batches, and seconds spent waiting for searches to join them.
fn batch_counters(server: &Server) -> (f64, f64, f64) {
    (
        server.metric("quiver_searches_batched_total"),
        server.metric("quiver_search_batches_total"),
        server.metric("quiver_search_gather_seconds_total"),
    )
}

/// Searches answered per second with one client per query, each repeating
/// its query on its own keep-alive connection: those answered in
/// `SEARCH_MEASURED` after a first `SEARCH_WARM_UP` (connecting, and the
/// first turns' batches, which find the clients not all there yet).
fn searches_per_second(addr: std::net::SocketAddr, queries: &[String]) -> f64 {
    let from = Instant::now() + SEARCH_WARM_UP;
    let until = from + SEARCH_MEASURED;
    let threads: Vec<_> = queries
        .iter()
        .cloned()
        .map(|query| {
            std::thread::spawn(move || {
                let mut client = harness::Client::connect(addr);
                let path = "/api/v1/embeddings/wide/search";
                let request = harness::request_bytes("POST", path, &[("X-Service-API-Key", KEY)], Some(&query));
                let mut answered = 0u64;
                loop {
                    assert_eq!(client.status_of(&request), 200);
                    let now = Instant::now();
                    if now >= until {
                        return answered;
                    }
                    if now >= from {
                        answered += 1;
                    }
                }
            })
        })
        .collect();
    let answered: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    answered as f64 / SEARCH_MEASURED.as_secs_f64()
}

/// The time `threads` threads take to read `floats` f32 from memory with
/// SIMD, each summing its share: the floor a scan of that many vectors
/// cannot beat with that many threads (median of 9).
fn memory_floor(floats: usize, threads: usize) -> Duration {
    use wide::f32x8;
    let buffer: Vec<f32> = (0..floats).map(|i| (i % 7) as f32).collect();
    let sum = |share: &[f32]| {
        let mut acc = [f32x8::ZERO; 4];
        for block in share.chunks_exact(32) {
            for (lane, total) in acc.iter_mut().enumerate() {
                let values: [f32; 8] = block[lane * 8..lane * 8 + 8].try_into().unwrap();
                *total += f32x8::new(values);
            }
        }
        std::hint::black_box(acc);
    };
    let mut runs = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for share in buffer.chunks(floats.div_ceil(threads)) {
                scope.spawn(move || sum(share));
            }
        });
        runs.push(started.elapsed());
    }
    median(&mut runs, Duration::cmp)
}

/// A command for `tool`, pinned to `core` with taskset when `pin`.
fn pinned(tool: &str, core: &str, pin: bool) -> Command {
    if !pin {
        return Command::new(tool);
    }
    let mut command = Command::new("taskset");
    command.args(["-c", core, tool]);
    command
}

/// Whether `tool` runs at all.
fn have(tool: &str) -> bool {
    Command::new(tool).arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Target 3: wrk against quiver and against one nginx worker serving a
/// static JSON body, each server on core 0 and wrk on core 1 (when taskset
/// is there to pin them), 50 connections, three rounds of 5 s. Each figure
/// comes with the server's CPU time per request, user and kernel, and the
/// small search also runs against an index of 12 rows: the same request,
/// parsed and answered, with next to nothing to scan.
fn small_requests(server: &Server, table: &mut Table) {
    const HEALTH: &str = "3. health, wrk -c50 (median of 3 x 5 s)";
    const SEARCH: &str = "3. search 1,000 x 128 cosine, k=10, wrk -c50 (median of 3 x 5 s)";
    const FLOOR: &str = "3. the same search of 12 rows: all but the scan (median of 3 x 5 s)";
    if !have("wrk") || !have("nginx") {
        let skipped = "skipped: needs wrk and nginx (apt-get install wrk nginx-light)";
        for (name, goal) in [(HEALTH, ">= 1"), (SEARCH, ">= 1"), (FLOOR, "-")] {
            table.add(name, skipped.into(), "-".into(), None, goal);
        }
        return;
    }
    let mut rng = Rng(11);
    for (name, rows) in [("small", BATCH), ("twelve", 12)] {
        create_index(server, name, 128, "cosine");
        let texts = vector_texts(&mut rng, rows, 128);
        let path = format!("/api/v1/embeddings/{name}/insert");
        assert_eq!(server.call("PUT", &path, Some(&insert_body(&texts, 0))).status, 200);
    }
    let health_body = serde_json::to_string(&server.call("GET", "/api/v1/health", None).body).unwrap();

    let dir = tempfile::tempdir().expect("temporary directory");
    let pin = have("taskset");
    let nginx_port = free_port();
    let mut nginx = start_nginx(dir.path(), nginx_port, &health_body, pin);
    if pin {
        let pid = server.child.id().to_string();
        Command::new("taskset").args(["-a", "-cp", "0", &pid]).stdout(Stdio::null()).status().unwrap();
    }
    let script = dir.path().join("search.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = '{}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             wrk.headers[\"X-Service-API-Key\"] = \"{KEY}\"\n",
            search_body(&mut rng, 128)
        ),
    )
    .unwrap();
    let quiver = format!("http://{}", server.addr);
    let nginx_url = format!("http://127.0.0.1:{nginx_port}");
    let rows = [
        (HEALTH, "/api/v1/health", None, ">= 1"),
        (SEARCH, "/api/v1/embeddings/small/search", Some(&script), ">= 1"),
        (FLOOR, "/api/v1/embeddings/twelve/search", Some(&script), "-"),
    ];
    for (name, path, lua, goal) in rows {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let lua = lua.map(|p| p.as_path());
            ours.push(served(server.child.id(), || wrk(&format!("{quiver}{path}"), lua, pin)));
            theirs.push(served(nginx.id(), || wrk(&format!("{nginx_url}{path}"), lua, pin)));
        }
        let by_rate = |a: &Served, b: &Served| a.rate.total_cmp(&b.rate);
        let (ours, theirs) = (median(&mut ours, by_rate), median(&mut theirs, by_rate));
        table.add(
            name,
            ours.to_string(),
            format!("nginx, 1 worker, static JSON: {theirs}"),
            Some(ours.rate / theirs.rate),
            goal,
        );
    }
    let _ = nginx.kill();
    let _ = nginx.wait();
}

/// Requests per second and the server's CPU time per request.
#[derive(Clone, Copy)]
struct Served {
    rate: f64,
    user_us: f64,
    kernel_us: f64,
}

impl std::fmt::Display for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = self.rate;
        write!(f, "{rate:.0} requests/s, CPU {:.1} µs user + {:.1} µs kernel each", self.user_us, self.kernel_us)
    }
}

/// What `load` (wrk, 5 s) reports, with the CPU time process `pid` spent meanwhile.
fn served(pid: u32, load: impl FnOnce() -> f64) -> Served {
    let before = cpu_seconds(pid);
    let rate = load();
    let after = cpu_seconds(pid);
    let requests = rate * WRK_SECONDS as f64;
    let per_request = |spent: f64| spent * 1e6 / requests;
    Served { rate, user_us: per_request(after.0 - before.0), kernel_us: per_request(after.1 - before.1) }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One nginx worker answering every request with `body` as JSON.
fn start_nginx(dir: &Path, port: u16, body: &str, pin: bool) -> std::process::Child {
    let d = dir.display();
    let conf = format!(
        "worker_processes 1;\ndaemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      default_type application/json;\n      \
         return 200 '{body}';\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = pinned("nginx", "0", pin)
        .args(["-p", &d.to_string(), "-e", &format!("{d}/error.log"), "-c"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not start: {:?}", std::fs::read_to_string(dir.join("error.log")));
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// How long each wrk round runs.
const WRK_SECONDS: u64 = 5;

/// Requests per second wrk reports for 5 s of 50 connections on one thread.
fn wrk(url: &str, script: Option<&Path>, pin: bool) -> f64 {
    let mut command = pinned("wrk", "1", pin);
    command.args(["-t1", "-c50", &format!("-d{WRK_SECONDS}s")]);
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let output = command.arg(url).output().expect("run wrk");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("Non-2xx"), "wrk saw errors from {url}:\n{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec from wrk:\n{text}"))
}

/// Target 5: resident memory after ingest, int8 codes included, against
/// 1.25 x the raw vector bytes + 64 MiB: 100,000 x 768 and 1,000,000 x 128
/// cosine with short metadata, loaded over HTTP.
fn memory(table: &mut Table) {
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    for (rows, dims) in [(100_000, 768), (1_000_000, 128)] {
        let server = Server::start();
        create_index(&server, "mem", dims, "cosine");
        load(&server, "mem", dims, rows, &mut Rng(13));
        // The request buffers are given back at the first sweep (every
        // 250 ms) with no large request since the one before: 250 to 500
        // ms after the last.
        std::thread::sleep(Duration::from_millis(1_000));
        let rss = server.status_kib("VmRSS") as f64 * 1024.0;
        let raw = (rows * dims * 4) as f64;
        let budget = 1.25 * raw + (64 << 20) as f64;
        table.add(
            &format!("5. resident memory after ingest, {rows} x {dims} cosine, metadata {{\"n\":\"<id>\"}}"),
            format!("{:.0} MiB", mib(rss)),
            format!("1.25 x {:.0} MiB raw + 64 MiB = {:.0} MiB", mib(raw), mib(budget)),
            Some(rss / budget),
            "<= 1",
        );
    }
}

/// The first pass's reference: int8 products a second on every core at once, by
/// the instructions the server's first pass multiplies with (`vpdpbusd` on
/// AVX-512 VNNI or AVX-VNNI, `vpmaddubsw`, `vpmaddwd`, `vpaddd` on AVX2),
/// their operands in registers: no scan of codes can go faster. `None`
/// where the CPU has none of them. The instruction set's name comes with it.
/// Where the server is held to AVX2 (`QUIVER_SIMD=avx2`, which it inherits),
/// so is the peak: the ratio is of one instruction set.
fn int8_peak(threads: usize) -> Option<(f64, &'static str)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let wider = !std::env::var("QUIVER_SIMD").is_ok_and(|simd| simd.eq_ignore_ascii_case("avx2"));
        const ITERATIONS: u64 = 20_000_000;
        const PEAK_TRIES: usize = 5;
        type Loop = fn(u64) -> (u64, i32);
        let (run, name): (Loop, &str) = if wider && has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
            // SAFETY: the CPU has the instructions (just detected).
            (|n| unsafe { peak::vnni512(n) }, "AVX-512 VNNI")
        } else if wider && has!("avxvnni") {
            // SAFETY: as above.
            (|n| unsafe { peak::vnni256(n) }, "AVX-VNNI")
        } else if has!("avx2") {
            // SAFETY: as above.
            (|n| unsafe { peak::avx2(n) }, "AVX2")
        } else {
            return None;
        };
        std::hint::black_box(run(ITERATIONS / 10)); // the clocks up
                                                    // A peak is the best of several tries: one try of the same loop
                                                    // has measured from 130 to 181 G/s on a shared 2-core machine.
        let once = || {
            let started = Instant::now();
            let products: u64 = std::thread::scope(|scope| {
                let all: Vec<_> =
                    (0..threads).map(|_| scope.spawn(|| std::hint::black_box(run(ITERATIONS)).0)).collect();
                all.into_iter().map(|t| t.join().unwrap()).sum()
            });
            products as f64 / started.elapsed().as_secs_f64()
        };
        Some(((0..PEAK_TRIES).map(|_| once()).fold(0.0, f64::max), name))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}

/// The loops of `int8_peak`: twelve independent sums (enough to hide each
/// instruction's latency), the query register passed through `black_box`
/// every iteration so that the compiler cannot know it and take products
/// out of the loop (a query toggled by a constant let it: the first run
/// gave 20 times the instructions' throughput). Each returns the products
/// it did, and a value of the sums for `black_box`.
#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    const SUMS: usize = 12;

    /// The loop of `avx2` and `vnni256`, `$sum = $multiply` adding 32
    /// products of `$row` and `$query` to `$sum`. A macro, not a function
    /// taking the multiply as a closure: that one measured AVX2's peak at
    /// 137 G/s on the machine where this gives 178 to 181.
    macro_rules! sums256 {
        ($iterations:expr, |$sum:ident, $row:ident, $query:ident| $multiply:expr) => {{
            let rows: [__m256i; SUMS] = std::array::from_fn(|r| _mm256_set1_epi8(r as i8 + 1));
            let mut $query = _mm256_set1_epi8(3);
            let mut sums = [_mm256_setzero_si256(); SUMS];
            for _ in 0..$iterations {
                $query = std::hint::black_box($query);
                for ($sum, &$row) in sums.iter_mut().zip(&rows) {
                    *$sum = $multiply;
                }
            }
            ($iterations * (SUMS * 32) as u64, lanes_sum(sums))
        }};
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(iterations: u64) -> (u64, i32) {
        let ones = _mm256_set1_epi16(1);
        sums256!(iterations, |sum, row, query| {
            _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(row, query), ones))
        })
    }

    #[target_feature(enable = "avx2,avxvnni")]
    pub unsafe fn vnni256(iterations: u64) -> (u64, i32) {
        sums256!(iterations, |sum, row, query| _mm256_dpbusd_avx_epi32(*sum, row, query))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn vnni512(iterations: u64) -> (u64, i32) {
        let rows: [__m512i; SUMS] = std::array::from_fn(|r| _mm512_set1_epi8(r as i8 + 1));
        let mut query = _mm512_set1_epi8(3);
        let mut sums = [_mm512_setzero_si512(); SUMS];
        for _ in 0..iterations {
            query = std::hint::black_box(query);
            for (sum, &row) in sums.iter_mut().zip(&rows) {
                *sum = _mm512_dpbusd_epi32(*sum, row, query);
            }
        }
        let total = sums.iter().fold(0i32, |total, &sum| total.wrapping_add(_mm512_reduce_add_epi32(sum)));
        (iterations * (SUMS * 64) as u64, total)
    }

    #[target_feature(enable = "avx2")]
    fn lanes_sum(sums: [__m256i; SUMS]) -> i32 {
        let mut lanes = [0i32; 8];
        let total = sums.iter().fold(_mm256_setzero_si256(), |total, &sum| _mm256_add_epi32(total, sum));
        // SAFETY: 32 bytes into 8 i32s.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), total) };
        lanes.iter().fold(0, |total, &lane| total.wrapping_add(lane))
    }
}

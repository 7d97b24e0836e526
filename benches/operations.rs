//! Issue 37's figures, each against its reference in the same run:
//! `quiver import` of a 100,000 x 768 `.npy` against the same rows sent
//! over raw HTTP; `quiver export` to Parquet; a snapshot download of the
//! index while writes go on, and those writes' p99 with and without it;
//! health requests over TLS against plain HTTP (wrk, where it is installed):
//! with the server held to half a core, so that wrk on the other core
//! out-runs it in both modes and the figure is the server's, and with a
//! whole core, where wrk's own TLS is the limit.
//! The table is also written to `target/operations-bench.md`.
//!
//! Run with `make bench` (or `cargo bench --bench operations`).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::{cpu_seconds, create_index, Rng, Server, KEY};
use npyz::WriterBuilder;

const DIMS: usize = 768;
const ROWS: usize = 100_000;
const BATCH: usize = 1_000;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(37);
    let values: Vec<f32> = (0..ROWS * DIMS).map(|_| rng.float()).collect();
    let vector_mb = (ROWS * DIMS * 4) as f64 / 1e6;
    let mut table = String::from("| figure | ours | reference | ratio | goal |\n|---|---|---|---|---|\n");
    let mut row = |figure: &str, ours: String, reference: String, ratio: f64, goal: &str| {
        println!("  {figure}: {ours} | reference {reference} | ratio {ratio:.2} (goal {goal})");
        writeln!(table, "| {figure} | {ours} | {reference} | {ratio:.2} | {goal} |").unwrap();
    };
    println!("operations (release server, loopback)");
    let server = Server::start();

    // Raw HTTP: the rows in bodies of 1,000, one client, as a script would.
    create_index(&server, "raw", DIMS, "cosine");
    let mut client = server.connect();
    let started = Instant::now();
    for batch in 0..ROWS / BATCH {
        let mut body = String::from(r#"{"embeddings":["#);
        for i in batch * BATCH..(batch + 1) * BATCH {
            if i > batch * BATCH {
                body.push(',');
            }
            write!(body, r#"{{"id":{i},"data":["#).unwrap();
            for (d, x) in values[i * DIMS..(i + 1) * DIMS].iter().enumerate() {
                if d > 0 {
                    body.push(',');
                }
                body.push_str(ryu::Buffer::new().format_finite(*x));
            }
            body.push_str("]}");
        }
        body.push_str("]}");
        let r = client.call("PUT", "/api/v1/embeddings/raw/insert", Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
    }
    let raw = vector_mb / started.elapsed().as_secs_f64();

    // `quiver import` of the same rows from a .npy.
    let npy = dir.path().join("rows.npy");
    let file = std::io::BufWriter::new(std::fs::File::create(&npy).unwrap());
    let mut writer =
        npyz::WriteOptions::new().default_dtype().shape(&[ROWS as u64, DIMS as u64]).writer(file).begin_nd().unwrap();
    writer.extend(values.iter().copied()).unwrap();
    writer.finish().unwrap();
    create_index(&server, "imported", DIMS, "cosine");
    let started = Instant::now();
    let (status, said) = tool(&server, &["import", "--index", "imported"], &npy);
    let imported = vector_mb / started.elapsed().as_secs_f64();
    assert_eq!(status, 0, "{said}");
    row(
        "1. quiver import, 100,000 x 768 .npy (MB of vectors a second)",
        format!("{imported:.0} MB/s"),
        format!("raw HTTP, 1,000 a body, one client: {raw:.0} MB/s"),
        imported / raw,
        ">= 0.8",
    );

    // `quiver export` to Parquet.
    let parquet = dir.path().join("out.parquet");
    let started = Instant::now();
    let (status, said) = tool(&server, &["export", "--index", "imported"], &parquet);
    let exported = vector_mb / started.elapsed().as_secs_f64();
    assert_eq!(status, 0, "{said}");
    row(
        "2. quiver export to Parquet (MB of vectors a second)",
        format!("{exported:.0} MB/s"),
        "200 MB/s".into(),
        exported / 200.0,
        ">= 1",
    );

    // Writes' latency alone, then while downloads run back to back.
    let alone = write_latencies(&server, Duration::from_secs(4), || {});
    let mut downloads = Vec::new();
    let during = write_latencies(&server, Duration::from_secs(4), || {
        downloads.push(download_mb_per_s(server.addr));
    });
    downloads.sort_by(f64::total_cmp);
    let download = downloads[downloads.len() / 2];
    row(
        "3. snapshot download of 100,000 x 768 while writes go on (median)",
        format!("{download:.0} MB/s ({} downloads)", downloads.len()),
        "500 MB/s".into(),
        download / 500.0,
        ">= 1",
    );
    let (p99_alone, p99_during) = (p99(alone), p99(during));
    row(
        "3. writes' p99 (10 x 768 upserts) during downloads",
        format!("{:.2} ms", p99_during * 1e3),
        format!("without: {:.2} ms", p99_alone * 1e3),
        p99_during / p99_alone,
        "<= 2",
    );
    drop(server);
    let held = "4. TLS: health requests/s, the server held to half a core, wrk -c50 (median of 3 x 5 s)";
    match CpuShare::new(50) {
        Some(share) => match tls_vs_plain(Some(&share)) {
            Some([tls, plain]) => row(
                held,
                format!("{:.0} requests/s over TLS (wrk's CPU {:.0}%)", tls.rate, tls.client_busy * 100.0),
                format!("plain HTTP: {:.0} requests/s (wrk's CPU {:.0}%)", plain.rate, plain.client_busy * 100.0),
                tls.rate / plain.rate,
                ">= 0.7",
            ),
            None => println!("  {held}: skipped, needs wrk (apt-get install wrk)"),
        },
        None => println!("  {held}: skipped, needs a CPU cgroup this process may make (root)"),
    }
    let health = "4. TLS: health requests/s, the server on a whole core, wrk -c50 (median of 3 x 5 s)";
    let cost = "4. TLS: the server's CPU a health request (median of 3 x 5 s)";
    match tls_vs_plain(None) {
        Some([tls, plain]) => {
            row(
                health,
                format!("{:.0} requests/s over TLS (wrk's CPU {:.0}%)", tls.rate, tls.client_busy * 100.0),
                format!("plain HTTP: {:.0} requests/s (wrk's CPU {:.0}%)", plain.rate, plain.client_busy * 100.0),
                tls.rate / plain.rate,
                "- (wrk's own limit)",
            );
            row(
                cost,
                format!("{:.1} µs over TLS", tls.server_us),
                format!("plain HTTP: {:.1} µs", plain.server_us),
                plain.server_us / tls.server_us,
                "- (requests a core serves, TLS / plain)",
            );
        }
        None => println!("  {health}: skipped, needs wrk (apt-get install wrk)"),
    }
    let out = std::path::Path::new("target/operations-bench.md");
    std::fs::write(out, table).unwrap();
    println!("table written to {}", out.display());
}

fn tool(server: &Server, args: &[&str], file: &std::path::Path) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .args(["--url", &format!("http://{}", server.addr)])
        .arg(file)
        .env("QUIVER_API_KEY", KEY)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("    {}", said.trim());
    (output.status.code().unwrap_or(-1), said)
}

/// Upserts of 10 rows, one after another for `how_long`, each timed, while
/// `alongside` runs again and again on this thread's other side.
fn write_latencies(server: &Server, how_long: Duration, mut alongside: impl FnMut() + Send) -> Vec<f64> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut client = server.connect();
            let mut rng = Rng(5);
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let items: Vec<String> = (0..10)
                    .map(|i| {
                        let data: Vec<String> = (0..DIMS).map(|_| rng.float().to_string()).collect();
                        format!(r#"{{"id":{},"data":[{}]}}"#, (n * 10 + i) % 50_000, data.join(","))
                    })
                    .collect();
                let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
                let started = Instant::now();
                let r = client.call("PUT", "/api/v1/embeddings/imported/upsert", Some(&body));
                latencies.push(started.elapsed().as_secs_f64());
                assert_eq!(r.status, 200);
                n += 1;
            }
            latencies
        });
        let deadline = Instant::now() + how_long;
        while Instant::now() < deadline {
            alongside();
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    })
}

/// One snapshot download read as a client that stores it would, a
/// megabyte at a time to EOF (the connection ends with it); its MB/s.
fn download_mb_per_s(addr: std::net::SocketAddr) -> f64 {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let request =
        format!("GET /api/v1/indexes/imported/snapshot HTTP/1.1\r\nHost: b\r\nX-Service-API-Key: {KEY}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let (mut buffer, mut bytes) = (vec![0u8; 1 << 20], 0usize);
    loop {
        match stream.read(&mut buffer).unwrap() {
            0 => break,
            n => {
                if bytes == 0 {
                    assert!(buffer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buffer[..n.min(200)]));
                }
                bytes += n;
            }
        }
    }
    bytes as f64 / 1e6 / started.elapsed().as_secs_f64()
}

fn p99(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() * 99 / 100]
}

/// One wrk round: requests a second, the server's CPU a request, and
/// the share of its core wrk kept busy.
#[derive(Clone, Copy)]
struct Round {
    rate: f64,
    server_us: f64,
    client_busy: f64,
}

/// Health requests over TLS and over plain HTTP, wrk's 50 connections on
/// one server each (a certificate made here), the median of three rounds
/// that alternate. The server runs on one core and wrk on the other where
/// taskset can pin them, the servers within `share` if given; None
/// without wrk.
fn tls_vs_plain(share: Option<&CpuShare>) -> Option<[Round; 2]> {
    let have = |tool: &str| {
        Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success())
    };
    if !have("wrk") {
        return None;
    }
    let pin = have("taskset");
    let dir = tempfile::tempdir().unwrap();
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();
    let tls = Server::start_with(&["--tls-cert", cert_path.to_str().unwrap(), "--tls-key", key_path.to_str().unwrap()]);
    let plain = Server::start();
    for server in [&tls, &plain] {
        if pin {
            let pid = server.child.id().to_string();
            Command::new("taskset").args(["-a", "-cp", "0", &pid]).output().unwrap();
        }
        if let Some(share) = share {
            share.hold(server.child.id());
        }
    }
    let seconds = 5.0;
    let round = |server: &Server, url: &str| {
        let mut command = Command::new(if pin { "taskset" } else { "wrk" });
        if pin {
            command.args(["-c", "1", "wrk"]);
        }
        let before = cpu_seconds(server.child.id());
        let child = command
            .args(["-t1", "-c50", &format!("-d{seconds}s"), url])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run wrk");
        // wrk's own CPU, read while it runs (its first and last moments aside).
        std::thread::sleep(Duration::from_millis(500));
        let wrk_before = cpu_seconds(child.id());
        std::thread::sleep(Duration::from_secs_f64(seconds - 1.0));
        let wrk_after = cpu_seconds(child.id());
        let output = child.wait_with_output().unwrap();
        let after = cpu_seconds(server.child.id());
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(!text.contains("Non-2xx") && !text.contains("Socket errors"), "wrk saw errors from {url}:\n{text}");
        let rate: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("Requests/sec:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no Requests/sec from wrk:\n{text}"));
        let spent = |(user, kernel): (f64, f64)| user + kernel;
        Round {
            rate,
            server_us: (spent(after) - spent(before)) * 1e6 / (rate * seconds),
            client_busy: (spent(wrk_after) - spent(wrk_before)) / (seconds - 1.0),
        }
    };
    let (mut over_tls, mut over_plain) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        over_tls.push(round(&tls, &format!("https://localhost:{}/api/v1/health", tls.addr.port())));
        over_plain.push(round(&plain, &format!("http://127.0.0.1:{}/api/v1/health", plain.addr.port())));
    }
    let rates = |rounds: &[Round]| rounds.iter().map(|r| format!("{:.0}", r.rate)).collect::<Vec<_>>().join(", ");
    println!("    rounds: TLS {}; plain {}", rates(&over_tls), rates(&over_plain));
    let median = |mut rounds: Vec<Round>| {
        rounds.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        rounds[rounds.len() / 2]
    };
    Some([median(over_tls), median(over_plain)])
}

/// A CPU cgroup holding its processes to a share of one core (cgroup v2's
/// `cpu.max`, or v1's CFS quota), removed when dropped, once they are gone.
struct CpuShare {
    dir: std::path::PathBuf,
}

impl CpuShare {
    /// None where this process may not make one (not root, no cpu controller).
    fn new(percent_of_a_core: u64) -> Option<CpuShare> {
        let root = std::path::Path::new("/sys/fs/cgroup");
        let name = format!("quiver-bench-{}", std::process::id());
        let (quota, period) = (percent_of_a_core * 1_000, 100_000);
        if root.join("cgroup.controllers").exists() {
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
            let share = CpuShare { dir: root.join(name) };
            std::fs::create_dir(&share.dir).ok()?;
            std::fs::write(share.dir.join("cpu.max"), format!("{quota} {period}")).ok()?;
            return Some(share);
        }
        let share = CpuShare { dir: root.join("cpu").join(name) };
        std::fs::create_dir(&share.dir).ok()?;
        std::fs::write(share.dir.join("cpu.cfs_period_us"), period.to_string()).ok()?;
        std::fs::write(share.dir.join("cpu.cfs_quota_us"), quota.to_string()).ok()?;
        Some(share)
    }

    /// Moves process `pid`, every thread of it, into the share.
    fn hold(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("a process moved into the CPU cgroup");
    }
}

impl Drop for CpuShare {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

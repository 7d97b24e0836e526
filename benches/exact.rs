//! A lone exact search (k = 10, one thread) against FAISS's flat indexes,
//! one thread, on the same random data in the same run: quiver with its int8
//! first pass, quiver scoring every row in f32, and FAISS `IndexFlatIP`
//! (cosine on rows normalised when the index is built) or `IndexFlatL2`.
//! Also the share of rows the first pass leaves to be scored exactly.
//!
//! FAISS runs from the Python in `target/benchenv` (`make bench` installs
//! `faiss-cpu` there from benches/requirements-bench.txt) or the one
//! `QUIVER_BENCH_PYTHON` names; without it, the FAISS column says so.
//! `cargo bench --bench exact -- small` runs the 100,000 x 768 cases only,
//! `-- 1000000x128` that size only (`-- 400000x50`: GloVe's shape, random).
//! The table goes to `target/exact-bench-<build>.md`, where the build is
//! `native` (`-C target-cpu=native`) or `portable` (plain `cargo build`).
//! `QUIVER_SIMD=avx2` holds quiver to AVX2's kernels, as it does the server.

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use harness::Rng;
use quiver::store::aligned::Aligned;
use quiver::store::cpu;
use quiver::store::topk::TopK;
use quiver::store::{Index, Metric, Scanner};

const QUERIES: usize = 32;
const K: usize = 10;

/// `n` floats in [-1, 1) from the tests' generator.
fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.float()).collect()
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// quiver's lone searches of `queries`: the median milliseconds with the
/// first pass and without, and the share of rows rescored.
fn ours(index: &Index, queries: &[Vec<f32>]) -> (f64, f64, f64) {
    let mut scanner = Scanner::with_threads(1);
    let mut top = TopK::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for query in queries {
            let started = Instant::now();
            scanner.search(index.view(), &[query], &[K], std::slice::from_mut(&mut top), None);
            with.push(started.elapsed().as_secs_f64() * 1000.0);
            let started = Instant::now();
            index.search_f32(query, K, &mut top);
            without.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let pass = scanner.take_work().first_pass;
    let share = if pass.rows == 0 { f64::NAN } else { pass.rescored as f64 / pass.rows as f64 };
    // The same queries as one batch, on one thread: the first pass of many
    // queries at once, per query.
    let batch: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
    let mut tops: Vec<TopK> = batch.iter().map(|_| TopK::new()).collect();
    let ks = vec![K; batch.len()];
    let mut batched = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        scanner.search(index.view(), &batch, &ks, &mut tops, None);
        batched.push(started.elapsed().as_secs_f64() * 1000.0 / batch.len() as f64);
    }
    println!("    batch of {}, one thread: {:.3} ms a query", batch.len(), median(batched));
    (median(with), median(without), share)
}

/// The Python with FAISS, if there is one.
fn python() -> Option<PathBuf> {
    let python = std::env::var_os("QUIVER_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/benchenv/bin/python"));
    let ok = Command::new(&python).args(["-c", "import faiss"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// FAISS's median milliseconds per metric on the data in `path`.
fn faiss(python: &Path, path: &Path, rows: usize, dims: usize, metrics: &[Metric]) -> Vec<f64> {
    let names: Vec<&str> = metrics.iter().map(|m| m.name()).collect();
    let output = Command::new(python)
        .arg("benches/faiss_flat.py")
        .arg(path)
        .args([rows.to_string(), dims.to_string(), QUERIES.to_string(), names.join(",")])
        .output()
        .expect("run benches/faiss_flat.py");
    assert!(output.status.success(), "faiss_flat.py: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let times: serde_json::Value = serde_json::from_str(text.trim()).expect("faiss_flat.py prints JSON");
    names.iter().map(|name| times[name].as_f64().expect("a time per metric")).collect()
}

fn main() {
    let chosen: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    // No argument: every case; `small`: 100,000 x 768; `<rows>x<dims>`: that one.
    let wanted = |rows: usize, dims: usize| {
        chosen.is_empty() || chosen.iter().any(|c| *c == format!("{rows}x{dims}") || (c == "small" && rows == 100_000))
    };
    let build = if cfg!(target_feature = "avx2") { "native" } else { "portable" };
    // `QUIVER_SIMD=avx2`, as the server takes it: AVX2's kernels on a CPU
    // that has wider ones.
    if std::env::var("QUIVER_SIMD").is_ok_and(|simd| simd.eq_ignore_ascii_case("avx2")) {
        cpu::set(cpu::Paths::choose(cpu::Simd::Avx2, true).expect("QUIVER_SIMD=avx2: this CPU has AVX2"))
            .expect("the paths fixed once");
    }
    let paths = cpu::paths();
    println!("exact: lone search, k = {K}, one thread, {build} build, {}", paths.describe());
    let python = python();
    if python.is_none() {
        println!("  FAISS not found (target/benchenv or QUIVER_BENCH_PYTHON): its column is left empty");
    }
    let cases: &[(usize, usize, &[Metric])] = &[
        (100_000, 768, &[Metric::Cosine, Metric::Ip, Metric::L2]),
        (1_000_000, 128, &[Metric::Ip, Metric::L2]),
        (1_000_000, 768, &[Metric::Cosine]),
        // GloVe's shape: few products a row, where each pair's bound and
        // bookkeeping weigh as much as its products.
        (400_000, 50, &[Metric::Cosine, Metric::Ip, Metric::L2]),
    ];
    let mut table = String::from(
        "| data | metric | int8 pass | f32 only | FAISS | ratio to FAISS | goal | rows rescored |\n|---|---|---|---|---|---|---|---|\n",
    );
    std::fs::create_dir_all("target/bench-data").expect("target/bench-data");
    for &(rows, dims, metrics) in cases.iter().filter(|c| wanted(c.0, c.1)) {
        let data = floats(rows as u64 ^ dims as u64, (rows + QUERIES) * dims);
        let path = PathBuf::from(format!("target/bench-data/{rows}x{dims}.f32"));
        if python.is_some() {
            let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("data file"));
            for x in &data {
                file.write_all(&x.to_le_bytes()).expect("write data");
            }
        }
        let reference = match &python {
            Some(python) => faiss(python, &path, rows, dims, metrics),
            None => vec![f64::NAN; metrics.len()],
        };
        let _ = std::fs::remove_file(&path);
        let (vectors, queries) = data.split_at(rows * dims);
        for (&metric, &theirs) in metrics.iter().zip(&reference) {
            let ids: Vec<i64> = (0..rows as i64).collect();
            let index =
                Index::from_parts(dims, metric, ids, Aligned::from_slice(vectors), vec![Default::default(); rows])
                    .expect("an index from the rows");
            let queries: Vec<Vec<f32>> = queries
                .chunks_exact(dims)
                .map(|q| {
                    let mut q = q.to_vec();
                    index.prepare_query(&mut q).expect("a query inside the domain");
                    q
                })
                .collect();
            let (with, without, share) = ours(&index, &queries);
            let goal = if metric == Metric::L2 { "<= 0.5" } else { "<= 0.35" };
            let line = format!(
                "| {rows} x {dims} | {} | {with:.2} ms | {without:.2} ms | {theirs:.2} ms | {:.2} | {goal} | {:.3}% |",
                metric.name(),
                with / theirs,
                share * 100.0
            );
            println!("  {line}");
            writeln!(table, "{line}").unwrap();
        }
    }
    let out = format!("target/exact-bench-{build}.md");
    let header = format!("{build} build, {}\n\n", paths.describe());
    std::fs::write(&out, header + &table).expect("write the table");
    println!("table written to {out}");
}

//! The scan paths: every SIMD path this CPU has, with the int8 first pass
//! and without, answers as the f64 oracle does; and with the pass each path
//! answers byte for byte as it does without it, scores included.

use quiver::store::cpu::{Paths, Simd, F32};
use serde_json::Value;

use crate::harness::{skip, Client, Rng, Server};
use crate::search_oracle::{check_search, write_batch, Metric, Model};

/// Rows that make the int8 codes lose the most: random, a crowd around one
/// point, values all of one magnitude (every code ±127), a spike among small
/// values, and magnitudes from 2^-40 to 2^40.
fn hard_rows(rng: &mut Rng, dims: usize, count: usize) -> Vec<Vec<f32>> {
    let center: Vec<f32> = (0..dims).map(|_| rng.float()).collect();
    (0..count)
        .map(|n| {
            let noise: Vec<f32> = (0..dims).map(|_| rng.float()).collect();
            match n % 5 {
                0 => noise,
                1 => center.iter().zip(&noise).map(|(c, x)| c + 1e-3 * x).collect(),
                2 => noise.iter().map(|x| if *x < 0.0 { -3.0 } else { 3.0 }).collect(),
                3 => {
                    let mut v: Vec<f32> = noise.iter().map(|x| x * 1e-4).collect();
                    v[n % dims] = 7.0;
                    v
                }
                _ => noise.iter().map(|x| x * 2f32.powi((n as i32 % 81) - 40)).collect(),
            }
        })
        .map(|v| if v.iter().all(|x| *x == 0.0) { vec![1.0; dims] } else { v })
        .collect()
}

/// Loads the same rows into an index of each metric and dimension on
/// `server`; returns the models.
fn load(server: &Server, seed: u64) -> Vec<(String, Metric, Model)> {
    let mut client = server.connect();
    let mut loaded = Vec::new();
    for metric in [
        Metric::Cosine,
        Metric::Ip,
        Metric::L2,
        Metric::L1,
        Metric::Linf,
        Metric::Bc,
        Metric::Lp(2.5),
        Metric::Canberra,
    ] {
        for (dims, count) in [(5, 300), (64, 500), (768, 600)] {
            let index = format!("{}-{dims}", metric.label());
            metric.create(server, &index, dims);
            let mut rng = Rng(seed + dims as u64);
            let items: Vec<(i64, Vec<f32>, String)> = hard_rows(&mut rng, dims, count)
                .into_iter()
                .enumerate()
                .map(|(id, v)| (id as i64, v, String::new()))
                .collect();
            for chunk in items.chunks(100) {
                write_batch(&mut client, &index, "insert", chunk);
            }
            let model = items.into_iter().map(|(id, v, tag)| (id, (v, tag))).collect();
            loaded.push((index, metric, model));
        }
    }
    loaded
}

/// The queries: stored rows and new hard rows.
fn queries(model: &Model, seed: u64, dims: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    let mut queries = hard_rows(&mut rng, dims, 10);
    queries.extend(model.values().step_by(97).map(|(v, _)| v.clone()));
    queries
}

fn search(client: &mut Client, index: &str, query: &[f32], k: usize) -> Value {
    let body = serde_json::json!({"queryVector": query, "k": k, "include": ["score"]}).to_string();
    let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body));
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

#[test]
fn every_scan_path_answers_as_the_oracle_with_the_int8_pass_and_without() {
    let paths = [
        (Simd::Avx512, "avx512", F32::Avx512),
        (Simd::Avx2, "avx2", F32::Avx2),
        (Simd::Baseline, "baseline", F32::Baseline),
    ];
    for (simd, flag, f32) in paths {
        if !f32.available() {
            skip(&format!("the {flag} scan path"), "this CPU lacks its instructions");
            continue;
        }
        let chosen = Paths::choose(simd, true).expect("a path the CPU has");
        let with = Server::start_with(&["--simd", flag]);
        let without = Server::start_with(&["--simd", flag, "--no-int8-pass"]);
        assert!(with.log().contains(&format!("scanning with {}", chosen.describe())), "{}", with.log());
        assert!(without.log().contains("int8 first pass off"), "{}", without.log());
        let loaded = load(&with, 7);
        load(&without, 7);
        let (mut a, mut b) = (with.connect(), without.connect());
        for (index, metric, model) in &loaded {
            let dims = model.values().next().unwrap().0.len();
            for (q, query) in queries(model, 99, dims).iter().enumerate() {
                for k in [1, 10, 50] {
                    check_search(&mut a, index, *metric, model, query, k);
                    let (got, want) = (search(&mut a, index, query, k), search(&mut b, index, query, k));
                    assert_eq!(got, want, "{flag}: {index}, query {q}, k {k}: the int8 pass changed the answer");
                }
            }
            // Batches of 6 and 20, either side of the 13 searches from which
            // indexes under 384 dimensions (here 5 and 64, not 768) keep the
            // bfloat16 pass where the CPU has it: through the int8 pass's
            // tiles of queries and a remainder, or bfloat16 (with the int8
            // pass), and bfloat16 or f32 (without it): each as each search
            // alone.
            let queries = queries(model, 98, dims);
            for count in [6, 20] {
                let searches: Vec<Value> = (queries.iter().cycle().take(count))
                    .map(|query| serde_json::json!({"queryVector": query, "k": 10, "include": ["score"]}))
                    .collect();
                let body = serde_json::json!({ "searches": searches }).to_string();
                let path = format!("/api/v1/embeddings/{index}/search-batch");
                let (got, want) = (a.call("POST", &path, Some(&body)), b.call("POST", &path, Some(&body)));
                assert_eq!((got.status, &got.body), (200, &want.body), "{flag}: {index}, a batch of {count}");
                for (n, (query, result)) in
                    queries.iter().cycle().zip(got.body["data"]["results"].as_array().unwrap()).enumerate()
                {
                    let alone = search(&mut a, index, query, 10);
                    assert_eq!(result, &alone["data"], "{flag}: {index}, search {n} of a batch of {count}");
                }
            }
        }
        // The pass ran where the path has an int8 kernel, and ruled most
        // rows out; without it, it never ran.
        let (rows, rescored) =
            (with.metric("quiver_search_first_pass_rows_total"), with.metric("quiver_search_rescored_rows_total"));
        if chosen.int8().is_some() {
            assert!(rows > 0.0 && rescored < rows / 2.0, "{flag}: {rescored} of {rows} rows rescored");
        } else {
            assert_eq!(rows, 0.0, "{flag}");
        }
        assert_eq!(without.metric("quiver_search_first_pass_rows_total"), 0.0, "{flag}");
    }
}

/// Rows like image patches: all positive, a common part at brightnesses
/// from a quarter to twice, varying (brightness apart) along two
/// directions of their kind, with a little noise; the first half of one
/// kind, the second of another (patches of one image, then of the next).
fn patch_rows(rng: &mut Rng, dims: usize, count: usize) -> Vec<Vec<f32>> {
    let base: Vec<f32> = (0..dims).map(|_| 1.0 + 0.1 * rng.float()).collect();
    let kinds: Vec<Vec<Vec<f32>>> =
        (0..2).map(|_| (0..2).map(|_| (0..dims).map(|_| 0.2 * rng.float()).collect()).collect()).collect();
    (0..count)
        .map(|n| {
            let directions = &kinds[n * 2 / count];
            let brightness = 1.125 + 0.875 * rng.float();
            let weights: Vec<f32> = directions.iter().map(|_| rng.float()).collect();
            (0..dims)
                .map(|i| {
                    let along: f32 = directions.iter().zip(&weights).map(|(u, w)| w * u[i]).sum();
                    brightness * (base[i] + along) + 0.002 * rng.float().abs()
                })
                .collect()
        })
        .collect()
}

/// Rows in a few directions (`patch_rows`), inserted in order, so that the
/// codes are centred from the first kind's rows and looked at again (at
/// 2,048 rows, not seen from outside) once the second kind's arrive: on the
/// AVX-512 and AVX2 paths, where this CPU has them, each search answers as
/// the f64 oracle does and byte for byte as without the int8 pass, in
/// cosine, ip and l2, and in each metric the pass rules out most rows.
#[test]
fn rows_in_a_few_directions_answer_as_the_oracle_and_are_mostly_ruled_out() {
    let (dims, count) = (192, 3_000);
    for (flag, f32) in [("avx512", F32::Avx512), ("avx2", F32::Avx2)] {
        if !f32.available() {
            skip(&format!("rows in a few directions on the {flag} path"), "this CPU lacks its instructions");
            continue;
        }
        let with = Server::start_with(&["--simd", flag]);
        let without = Server::start_with(&["--simd", flag, "--no-int8-pass"]);
        assert!(without.log().contains("int8 first pass off"), "{}", without.log());
        let (mut a, mut b) = (with.connect(), without.connect());
        let counts =
            || (with.metric("quiver_search_first_pass_rows_total"), with.metric("quiver_search_rescored_rows_total"));
        for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
            let (rows_before, rescored_before) = counts();
            let index = format!("patches-{}", metric.label());
            let mut rng = Rng(53);
            let rows = patch_rows(&mut rng, dims, count + 40);
            // Every 76th row held out as a query: 40 of them, of both kinds.
            let (mut items, mut queries) = (Vec::new(), Vec::new());
            for (n, v) in rows.into_iter().enumerate() {
                if n % 76 == 75 {
                    queries.push(v);
                } else {
                    items.push((n as i64, v, String::new()));
                }
            }
            for server in [&with, &without] {
                metric.create(server, &index, dims);
            }
            for chunk in items.chunks(100) {
                write_batch(&mut a, &index, "insert", chunk);
                write_batch(&mut b, &index, "insert", chunk);
            }
            let model: Model = items.into_iter().map(|(id, v, tag)| (id, (v, tag))).collect();
            for (q, query) in queries.iter().enumerate() {
                check_search(&mut a, &index, metric, &model, query, 10);
                let (got, want) = (search(&mut a, &index, query, 10), search(&mut b, &index, query, 10));
                assert_eq!(got, want, "{flag}: {index}, query {q}: the int8 pass changed the answer");
            }
            let (rows, rescored) = counts();
            let (rows, rescored) = (rows - rows_before, rescored - rescored_before);
            assert!(rows > 0.0 && rescored < rows / 10.0, "{flag}: {index}: {rescored} of {rows} rows rescored");
        }
        assert_eq!(without.metric("quiver_search_first_pass_rows_total"), 0.0, "{flag}");
    }
}

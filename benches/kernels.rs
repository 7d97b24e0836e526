//! Distance kernels (scalar reference vs `wide` SIMD) and top-k selection.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quiver::store::kernels::{self, scalar};
use quiver::store::topk::{Candidate, TopK};
use quiver::store::{Index, Metric};

fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn bench_kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("kernels");
    for dims in [7usize, 128, 768, 1536] {
        let (a, b) = (floats(1, dims), floats(2, dims));
        group.throughput(Throughput::Bytes((dims * 4) as u64));
        group.bench_with_input(BenchmarkId::new("dot/scalar", dims), &dims, |bench, _| {
            bench.iter(|| scalar::dot(black_box(&a), black_box(&b)))
        });
        group.bench_with_input(BenchmarkId::new("dot/simd", dims), &dims, |bench, _| {
            bench.iter(|| kernels::dot(black_box(&a), black_box(&b)))
        });
        group.bench_with_input(BenchmarkId::new("l2/scalar", dims), &dims, |bench, _| {
            bench.iter(|| scalar::l2_squared(black_box(&a), black_box(&b)))
        });
        group.bench_with_input(BenchmarkId::new("l2/simd", dims), &dims, |bench, _| {
            bench.iter(|| kernels::l2_squared(black_box(&a), black_box(&b)))
        });
    }
    group.finish();
}

/// The six distances beyond cosine, ip and l2 on one pair at 768
/// dimensions, from cache: their arithmetic alone, beside l2's. (Values are
/// made non-negative so that js scores them as it would.)
fn bench_distances(c: &mut Criterion) {
    use quiver::store::{Metric, Power};
    let mut group = c.benchmark_group("distances");
    let dims = 768;
    let (a, b): (Vec<f32>, Vec<f32>) = (floats(1, dims), floats(2, dims));
    let (a, b): (Vec<f32>, Vec<f32>) = (a.iter().map(|x| x.abs()).collect(), b.iter().map(|x| x.abs()).collect());
    group.throughput(Throughput::Bytes((dims * 4) as u64));
    let lp = |p| Metric::Lp(Power::new(p).expect("a valid p"));
    let kernels: [(&str, Metric); 9] = [
        ("l2", Metric::L2),
        ("l1", Metric::L1),
        ("linf", Metric::Linf),
        ("lp3", lp(3.0)),
        ("lp2.5", lp(2.5)),
        ("canberra", Metric::Canberra),
        ("bc", Metric::BrayCurtis),
        ("js", Metric::JensenShannon),
        ("lp0.5", lp(0.5)),
    ];
    for (name, kernel) in kernels {
        group.bench_function(BenchmarkId::new(name, dims), |bench| {
            bench.iter(|| black_box(kernel).distance(black_box(&a), black_box(&b)))
        });
    }
    group.finish();
}

fn bench_topk(c: &mut Criterion) {
    let distances = floats(3, 100_000);
    let mut group = c.benchmark_group("topk");
    group.throughput(Throughput::Elements(distances.len() as u64));
    for k in [10usize, 100, 1000] {
        let mut top = TopK::new();
        group.bench_with_input(BenchmarkId::new("100k", k), &k, |bench, &k| {
            bench.iter(|| {
                top.reset(k);
                for (row, &distance) in distances.iter().enumerate() {
                    top.push(Candidate { distance, id: row as i64, row: row as u32 });
                }
                black_box(top.sorted().len())
            })
        });
    }
    group.finish();
}

/// Several searches of one index read together (`Index::search_many_split`), on
/// one thread, against the same searches made one after another. The index,
/// 20,000 x 768 (61 MB), is larger than the caches, as a real one is.
/// Throughput is in queries: per query, 1 is the lone scan and the rest is
/// what reading the rows once for all of them saves.
fn bench_many(c: &mut Criterion) {
    const ROWS: usize = 20_000;
    const DIMS: usize = 768;
    let values = floats(4, ROWS * DIMS);
    let mut index = Index::new(DIMS, Metric::Cosine);
    for (id, vector) in values.chunks_exact(DIMS).enumerate() {
        index.upsert(id as i64, vector, b"");
    }
    let queries: Vec<Vec<f32>> = (0..64).map(|q| floats(100 + q, DIMS)).collect();
    let mut group = c.benchmark_group("many");
    group.sample_size(10);
    for count in [1usize, 4, 16, 32, 64] {
        let queries: Vec<&[f32]> = queries[..count].iter().map(Vec::as_slice).collect();
        let ks = vec![10; count];
        let mut tops: Vec<TopK> = (0..count).map(|_| TopK::new()).collect();
        group.throughput(Throughput::Elements(count as u64));
        group.bench_with_input(BenchmarkId::new("batched/20000x768", count), &count, |bench, _| {
            bench.iter(|| index.search_many_split(black_box(&queries), &ks, &mut tops, &mut Vec::<Vec<TopK>>::new()))
        });
        group.bench_with_input(BenchmarkId::new("one_by_one/20000x768", count), &count, |bench, _| {
            bench.iter(|| {
                for (query, top) in queries.iter().zip(&mut tops) {
                    index.search(black_box(query), 10, top);
                }
            })
        });
    }
    group.finish();
}

/// A lone search of 100,000 x 768 random rows on one thread, through the
/// int8 first pass and with every row scored in f32.
fn bench_lone(c: &mut Criterion) {
    const ROWS: usize = 100_000;
    const DIMS: usize = 768;
    let values = floats(5, ROWS * DIMS);
    let query = floats(6, DIMS);
    let mut group = c.benchmark_group("lone");
    group.sample_size(20);
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        let mut index = Index::new(DIMS, metric);
        for (id, vector) in values.chunks_exact(DIMS).enumerate() {
            index.upsert(id as i64, vector, b"");
        }
        let mut query = query.clone();
        index.prepare_query(&mut query).unwrap();
        let mut top = TopK::new();
        let name = format!("{}/100000x768", metric.name());
        group.bench_function(BenchmarkId::new("int8_pass", &name), |bench| {
            bench.iter(|| index.search(black_box(&query), 10, &mut top))
        });
        group.bench_function(BenchmarkId::new("f32_only", &name), |bench| {
            bench.iter(|| index.search_f32(black_box(&query), 10, &mut top))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_kernels, bench_distances, bench_topk, bench_many, bench_lone);
criterion_main!(benches);

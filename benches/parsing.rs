//! Request parsing: HTTP heads and bodies (JSON decoded into flat buffers).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use quiver::api::decode::{BodyLimits, Decoder};
use quiver::http::request::{Event, FramingLimits, Parser};
use quiver::http::ReadBuf;
use quiver::store::Batch;

const LIMITS: FramingLimits = FramingLimits {
    head_bytes_max: 16384,
    headers_max: 64,
    body_bytes_max: 1 << 28,
    chunks_max: 1 << 20,
    chunk_bytes_max: 1 << 26,
};

fn bench_head(c: &mut Criterion) {
    let head = b"POST /api/v1/embeddings/docs/search HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: python-requests/2.29.0\r\n\
Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\nX-Service-API-Key: 0123456789abcdef0123456789abcdef\r\n\
Content-Type: application/json\r\nContent-Length: 0\r\n\r\n";
    let mut group = c.benchmark_group("http");
    group.throughput(Throughput::Bytes(head.len() as u64));
    let mut parser = Parser::new(LIMITS);
    let mut buf = ReadBuf::with_capacity(16384);
    group.bench_function("head", |b| {
        b.iter(|| {
            buf.extend(black_box(head));
            assert_eq!(parser.advance(&mut buf), Event::Head);
            assert_eq!(parser.advance(&mut buf), Event::Request);
            parser.finish(&mut buf);
        })
    });
    group.finish();
}

fn bench_bodies(c: &mut Criterion) {
    let mut state = 1u64;
    let mut float = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_string()
    };
    let items: Vec<String> = (0..1000)
        .map(|id| {
            let data: Vec<String> = (0..768).map(|_| float()).collect();
            format!(r#"{{"id":{id},"data":[{}],"metadata":{{"title":"document {id}"}}}}"#, data.join(","))
        })
        .collect();
    let insert = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
    let query: Vec<String> = (0..768).map(|_| float()).collect();
    let search = format!(r#"{{"queryVector":[{}],"k":10}}"#, query.join(","));

    let mut group = c.benchmark_group("body");
    let mut decoder = Decoder::default();
    let mut batch = Batch::default();
    let mut scratch = insert.clone().into_bytes();
    group.throughput(Throughput::Bytes(insert.len() as u64));
    group.bench_function("insert 1000x768", |b| {
        b.iter(|| {
            scratch.copy_from_slice(insert.as_bytes());
            decoder.embeddings(&mut scratch, BodyLimits::DEFAULT, &mut batch).unwrap();
            black_box(batch.len())
        })
    });
    let mut vector = Vec::new();
    let mut scratch = search.clone().into_bytes();
    group.throughput(Throughput::Bytes(search.len() as u64));
    group.bench_function("search 768", |b| {
        b.iter(|| {
            scratch.copy_from_slice(search.as_bytes());
            black_box(decoder.search(&mut scratch, 10_000, BodyLimits::DEFAULT, &mut vector).unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_head, bench_bodies);
criterion_main!(benches);

//! The scans against brute force and against each other.

use std::sync::atomic::AtomicU32;

use super::coded::{Coded, CodedQueries};
use super::in_order::{InOrder, Keyed, LEFT_KEPT};
use super::*;
use crate::store::aligned::Aligned;
use crate::store::codes::floors::{Floor, Step};
use crate::store::codes::LANES;
use crate::store::index::Index;
use crate::store::topk::Candidate;

/// The ids of the `k` nearest to `query`, nearest first.
pub(crate) fn ids_of(index: &Index, query: &[f32], k: usize) -> Vec<i64> {
    let mut top = TopK::new();
    index.search(query, k, &mut top);
    top.sorted().iter().map(|c| c.id).collect()
}

#[test]
fn metrics_rank_as_documented() {
    let mut cosine = Index::new(2, Metric::Cosine);
    let mut ip = Index::new(2, Metric::Ip);
    let mut l2 = Index::new(2, Metric::L2);
    for (id, v) in [(1, [1.0, 0.0]), (2, [10.0, 1.0]), (3, [0.0, 1.0])] {
        cosine.upsert(id, &v, b"");
        ip.upsert(id, &v, b"");
        l2.upsert(id, &v, b"");
    }
    assert_eq!(ids_of(&cosine, &[1.0, 0.0], 3), vec![1, 2, 3]);
    assert_eq!(ids_of(&ip, &[1.0, 0.0], 3), vec![2, 1, 3]);
    assert_eq!(ids_of(&l2, &[1.0, 0.0], 3), vec![1, 3, 2]);
}

/// A masked scan finds, for each query, exactly the nearest rows among
/// those in the mask (brute force over the mask's rows), lone and in a
/// batch, on one thread and split across threads taking a few rows at
/// a time, whatever the mask's runs look like.
#[test]
fn a_mask_keeps_exactly_its_rows() {
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        let dims = 13;
        let mut index = Index::new(dims, metric);
        for id in 0..300i64 {
            let row: Vec<f32> = (0..dims as i64).map(|d| ((id * 37 + d * 11) % 29) as f32 - 14.0).collect();
            index.upsert(id * 3 - 100, &row, b"");
        }
        let queries: Vec<Vec<f32>> = (0..6)
            .map(|q| {
                let mut query: Vec<f32> = (0..dims as i64).map(|d| ((q * 7 + d * 5) % 13) as f32 - 6.0).collect();
                index.prepare_query(&mut query).unwrap();
                query
            })
            .collect();
        let masks: [Vec<u32>; 4] = [
            vec![],
            vec![7],
            (0..300).filter(|r| r % 3 != 1).collect(),
            (20..60).chain(61..62).chain(200..299).collect(),
        ];
        for rows in &masks {
            let mask: RoaringBitmap = rows.iter().copied().collect();
            for k in [1, 5, 400] {
                let mut alone = Vec::new();
                for query in &queries {
                    // Brute force: each masked row scored alone.
                    let mut want = TopK::new();
                    want.reset(k.min(rows.len()));
                    for &row in rows {
                        index.view().scan_exact(
                            &[query],
                            &[index.metric().query_scale(|| kernels::squared_norm(query))],
                            None,
                            row as usize..row as usize + 1,
                            std::slice::from_mut(&mut want),
                        );
                    }
                    let want: Vec<Candidate> = want.sorted().to_vec();
                    let mut top = TopK::new();
                    Scanner::with_threads(1).search(
                        index.view(),
                        &[query],
                        &[k],
                        std::slice::from_mut(&mut top),
                        Some(&mask),
                    );
                    assert_eq!(top.sorted(), &want[..], "{metric:?}, k {k}, {} rows", rows.len());
                    alone.push(want);
                }
                let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let ks = vec![k; refs.len()];
                for (threads, chunk) in [(1, 1000), (3, 7), (2, 1)] {
                    let mut tops: Vec<TopK> = refs.iter().map(|_| TopK::new()).collect();
                    let mut partials: Vec<Vec<TopK>> =
                        (1..threads).map(|_| refs.iter().map(|_| TopK::new()).collect()).collect();
                    index.view().search_in_chunks(
                        &refs,
                        &ks,
                        &mut tops,
                        (&mut partials, chunk),
                        Some(&mask),
                        &mut Buffers::default(),
                    );
                    for (top, want) in tops.iter_mut().zip(&alone) {
                        assert_eq!(top.sorted(), &want[..], "{metric:?}, k {k}, {threads} threads, chunk {chunk}");
                    }
                }
            }
        }
    }
}

/// `count` patterned vectors of `dims`, each under two ids (`twins_of`).
fn twins(dims: usize, count: i64, metric: Metric) -> Index {
    let vectors: Vec<Vec<f32>> =
        (0..count).map(|id| (0..dims as i64).map(|d| ((id * 31 + d * 17) % 23) as f32 - 11.5).collect()).collect();
    twins_of(&vectors, metric)
}

/// Searches `queries` at once, each for its `k` nearest, on
/// `partials.len() + 1` threads taking `chunk` rows at a time, and
/// asserts that each finds exactly what it finds alone.
fn assert_split_finds_what_each_finds_alone(
    index: &Index,
    queries: &[&[f32]],
    k: usize,
    partials: &mut [Vec<TopK>],
    chunk: usize,
) {
    let ks = vec![k; queries.len()];
    let mut split: Vec<TopK> = queries.iter().map(|_| TopK::new()).collect();
    index.view().search_in_chunks(queries, &ks, &mut split, (partials, chunk), None, &mut Buffers::default());
    let mut alone = TopK::new();
    for (query, split) in queries.iter().zip(&mut split) {
        index.search(query, k, &mut alone);
        let what = format!("{:?}, {} threads, k {k}, chunk {chunk}", index.metric(), partials.len() + 1);
        assert_eq!(split.sorted(), alone.sorted(), "{what}");
    }
}

#[test]
fn a_split_scan_finds_exactly_what_one_thread_finds() {
    let queries = [[1.0, -2.0, 0.5, 3.0, -1.0], [0.0, 1.0, 2.0, -3.0, 4.0], [2.0, 2.0, -2.0, 0.5, 1.0]];
    let queries: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
    for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
        let index = twins(5, 997, metric);
        for threads in 2..=5 {
            let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| (0..3).map(|_| TopK::new()).collect()).collect();
            // One query, then three at once; chunks of one row, of a few
            // tiles and a bit, and of more than the index holds.
            for (k, count) in [1, 10, 500, 5000].into_iter().flat_map(|k| [(k, 1), (k, 3)]) {
                for chunk in [1, 4 * row_tile() + 1, 1 << 20] {
                    assert_split_finds_what_each_finds_alone(&index, &queries[..count], k, &mut partials, chunk);
                }
            }
        }
    }
}

#[test]
fn many_searches_at_once_find_exactly_what_each_finds_alone() {
    for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
        let index = twins(300, 700, metric);
        let queries: Vec<Vec<f32>> =
            (0..9).map(|q| (0..300).map(|d| ((q * 7 + d * 3) % 11) as f32 - 5.0).collect()).collect();
        let ks = [1, 10, 700, 2000, 3, 1, 5, 10, 64];
        // 2 to 9 queries: every mix of full and partial query tiles.
        for count in 2..=9 {
            let queries: Vec<&[f32]> = queries[..count].iter().map(Vec::as_slice).collect();
            for threads in 1..4 {
                let mut tops: Vec<TopK> = (0..count).map(|_| TopK::new()).collect();
                let mut partials: Vec<Vec<TopK>> =
                    (1..threads).map(|_| (0..count).map(|_| TopK::new()).collect()).collect();
                index.search_many_split(&queries, &ks[..count], &mut tops, &mut partials);
                let mut alone = TopK::new();
                for (q, top) in tops.iter_mut().enumerate() {
                    index.search(queries[q], ks[q], &mut alone);
                    assert_eq!(top.sorted(), alone.sorted(), "{metric:?} query {q} of {count}, threads {threads}");
                }
            }
        }
    }
}

/// `count` random vectors of `dims` in [-1, 1), from `seed`.
#[cfg(target_arch = "x86_64")]
fn random_vectors(seed: u64, dims: usize, count: usize) -> Vec<Vec<f32>> {
    kernels::tests::floats(seed, dims * count).chunks_exact(dims).map(<[f32]>::to_vec).collect()
}

/// Each of `vectors` under two ids (`i` and `i + len`), so that ties
/// have to break the same way.
fn twins_of(vectors: &[Vec<f32>], metric: Metric) -> Index {
    let mut index = Index::new(vectors[0].len(), metric);
    for (id, v) in (0..).zip(vectors) {
        index.upsert(id, v, b"");
        index.upsert(vectors.len() as i64 + id, v, b"");
    }
    index
}

/// A batch through the bfloat16 pass against each search alone, on
/// random rows (where the pass rules most pairs out) and on a crowd of
/// rows around one point (where bfloat16 cannot tell the nearest apart,
/// so that the exact pass has to).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_bfloat16_pass_finds_exactly_what_each_search_finds_alone() {
    for metric in [Metric::Cosine, Metric::Ip] {
        for dims in [100, 768] {
            let random = random_vectors(1, dims, 1000);
            let center = &random[0];
            let crowd: Vec<Vec<f32>> = random_vectors(2, dims, 1000)
                .iter()
                .map(|noise| center.iter().zip(noise).map(|(c, n)| c + 0.001 * n).collect())
                .collect();
            for (data, vectors) in [("random", random.clone()), ("crowd", crowd)] {
                let index = twins_of(&vectors, metric);
                // Stored rows (each tied with its twin) and blends of two.
                let queries: Vec<Vec<f32>> = (0..9)
                    .map(|q| {
                        let (a, b) = (&random[q * 97], &random[q * 31 + 5]);
                        a.iter().zip(b).map(|(a, b)| if q % 3 == 0 { *a } else { a - 0.5 * b }).collect()
                    })
                    .collect();
                let what = format!("{metric:?}, {dims} dims, {data}");
                let Some(rescored) = assert_screened_finds_what_each_finds_alone(&index, &queries, &what) else {
                    return;
                };
                // Where rows are apart, the pass must rule most pairs
                // out, or it only costs time.
                let pairs = queries.len() * index.len();
                if data == "random" {
                    assert!(rescored * 10 < pairs, "{what}: {rescored} of {pairs} pairs scored twice");
                }
            }
        }
    }
}

/// Searches `queries` at once through the bfloat16 pass and asserts
/// that each finds exactly what it finds alone. Returns how many pairs
/// were scored exactly; `None`, recorded as a skip, where the CPU has
/// no pass (and fails if it has one, but the pass was not made).
#[cfg(target_arch = "x86_64")]
fn assert_screened_finds_what_each_finds_alone(index: &Index, queries: &[Vec<f32>], what: &str) -> Option<usize> {
    let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
    let ks = [1, 10, 10, 5, 20, 10, 3, 10, 40];
    let squared_norms: Vec<f64> = queries.iter().map(|q| kernels::squared_norm(q)).collect();
    let scales: Vec<f32> = squared_norms.iter().map(|&squared| index.metric().query_scale(|| squared)).collect();
    let Some(screen) = Screen::new(&queries, &squared_norms, &scales, index.dims()) else {
        assert!(!crate::testing::cpu_has_bf16(), "this CPU has AVX512-BF16, yet the pass was not made");
        crate::testing::skip(&format!("the bfloat16 pass, {what}"), "this CPU has no AVX512-BF16");
        return None;
    };
    let mut tops: Vec<TopK> = ks.iter().map(|_| TopK::new()).collect();
    for (top, &k) in tops.iter_mut().zip(&ks) {
        top.reset(k);
    }
    // SAFETY: `Screen::new` found the features.
    let rescored =
        unsafe { index.view().scan_screened(&queries, &scales, (&screen, &mut Vec::new()), 0..index.len(), &mut tops) };
    let mut alone = TopK::new();
    for (q, top) in tops.iter_mut().enumerate() {
        index.search(queries[q], ks[q], &mut alone);
        assert_eq!(top.sorted(), alone.sorted(), "{what}, query {q}");
    }
    // In small chunks on one and two threads: chunks through the pass
    // and chunks straight to the exact scan, where the pass falls back.
    for threads in 1..=2 {
        for chunk in [8, 100] {
            let mut partials: Vec<Vec<TopK>> =
                (1..threads).map(|_| queries.iter().map(|_| TopK::new()).collect()).collect();
            index.view().search_in_chunks(
                &queries,
                &ks,
                &mut tops,
                (&mut partials, chunk),
                None,
                &mut Buffers::default(),
            );
            for (q, top) in tops.iter_mut().enumerate() {
                index.search(queries[q], ks[q], &mut alone);
                assert_eq!(top.sorted(), alone.sorted(), "{what}, query {q}, {threads} threads, chunk {chunk}");
            }
        }
    }
    Some(rescored)
}

/// Rows and queries across the numeric domain: norms from 2^-62 to
/// 2^62, tiny and huge components side by side, signs that cancel.
fn extreme_vectors(seed: u64, dims: usize, count: usize, metric: Metric) -> Vec<Vec<f32>> {
    let scales = [3e-19f32, 1e-18, 1e-9, 1.0, 1e9, 1e17];
    let noise = kernels::tests::floats(seed, dims * count);
    noise
        .chunks_exact(dims)
        .enumerate()
        .map(|(n, v)| {
            let norm = scales[n % scales.len()];
            let scale = norm / (dims as f32).sqrt();
            let mut v: Vec<f32> =
                v.iter().enumerate().map(|(i, x)| x * scale * if (i + n) % 3 == 0 { 1e-6 } else { 1.0 }).collect();
            v[n % dims] = norm;
            let [v] = fit_for(metric, vec![v]).try_into().expect("one vector");
            let index = Index::new(dims, metric);
            assert_eq!(index.check_vector(&v), Ok(()), "test data inside the domain");
            v
        })
        .collect()
}

#[test]
fn prepared_queries_keep_every_cosine_distance_bit_for_bit() {
    let vectors = random_vectors(3, 37, 50);
    let index = twins_of(&vectors, Metric::Cosine);
    for (q, query) in random_vectors(4, 37, 6).into_iter().enumerate() {
        let mut prepared = query.iter().map(|x| x * 2f32.powi(q as i32 * 7 - 20)).collect::<Vec<f32>>();
        index.prepare_query(&mut prepared).unwrap();
        let norm = kernels::squared_norm(&prepared).sqrt();
        assert!((1.0..2.0).contains(&norm), "{norm}");
        let (mut plain, mut scaled) = (TopK::new(), TopK::new());
        index.search(&query, 100, &mut plain);
        index.search(&prepared, 100, &mut scaled);
        assert_eq!(plain.sorted(), scaled.sorted(), "query {q}");
    }
}

/// Batches of prepared queries at extreme magnitudes: split, tiled and
/// (where the CPU has it) through the bfloat16 pass, each answer is the
/// answer alone.
#[test]
fn batches_at_extreme_magnitudes_find_exactly_what_each_finds_alone() {
    for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
        for dims in [3, 64, 768] {
            let index = twins_of(&extreme_vectors(11, dims, 300, metric), metric);
            let mut queries = extreme_vectors(12, dims, 9, metric);
            for query in &mut queries {
                index.prepare_query(query).unwrap();
            }
            let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
            let mut partials: Vec<Vec<TopK>> = vec![(0..9).map(|_| TopK::new()).collect()];
            for k in [1, 10, 600] {
                assert_split_finds_what_each_finds_alone(&index, &refs, k, &mut partials, 64);
                assert_split_finds_what_each_finds_alone(&index, &refs, k, &mut [], 1 << 20);
            }
            #[cfg(target_arch = "x86_64")]
            if metric != Metric::L2 {
                let what = format!("{metric:?}, {dims} dims, extreme magnitudes");
                let _ = assert_screened_finds_what_each_finds_alone(&index, &queries, &what);
            }
        }
    }
}

/// Rows that make the int8 codes lose the most, for `metric`'s index of
/// `dims`: random, a crowd around one point (where only the exact score
/// tells rows apart), values all of one magnitude (every code ±127), one
/// spike among small values (most codes 0), mixed magnitudes, and tiny
/// values down to subnormals (where the index takes them).
#[cfg(target_arch = "x86_64")]
fn hard_for_codes(seed: u64, dims: usize, metric: Metric) -> Vec<Vec<f32>> {
    let random = random_vectors(seed, dims, 40);
    let center = &random[0];
    let mut rows: Vec<Vec<f32>> = random.clone();
    rows.extend(
        random_vectors(seed + 1, dims, 40)
            .iter()
            .map(|n| center.iter().zip(n).map(|(c, n)| c + 1e-3 * n).collect::<Vec<f32>>()),
    );
    rows.extend(random.iter().take(8).map(|v| v.iter().map(|x| if *x < 0.0 { -3.0 } else { 3.0 }).collect()));
    rows.extend(random.iter().take(8).enumerate().map(|(n, v)| {
        let mut v: Vec<f32> = v.iter().map(|x| x * 1e-4).collect();
        v[n % dims] = 7.0;
        v
    }));
    rows.extend(extreme_vectors(seed + 2, dims, 12, metric));
    rows.extend(random.iter().take(4).map(|v| v.iter().map(|x| x * 1e-38).collect()));
    rows.extend(random.iter().take(4).map(|v| v.iter().map(|x| x * 1e-44).collect()));
    let index = Index::new(dims, metric);
    let mut rows = fit_for(metric, rows);
    rows.retain(|v| index.check_vector(v).is_ok());
    rows
}

/// Rows along one common part at magnitudes across the numeric domain,
/// either way, with and without a little of something else: each coded
/// from its own multiple of the offset (`codes::offset_multiple`), up to
/// the most it may be and past it. The first 32 are of moderate
/// magnitudes, so that the index (each row twice, `twins_of`) is centred
/// from them at 64 rows and given multiples; the rest come after.
fn along_an_offset(seed: u64, dims: usize, metric: Metric) -> Vec<Vec<f32>> {
    let common: Vec<f32> = random_vectors(seed, dims, 1)[0].iter().map(|x| 3.0 + x).collect();
    let noise = random_vectors(seed + 1, dims, 72);
    let moderate = [0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 0.9];
    let extreme = [0.0, 1e-30, 7.9, 8.0, 20.0, -3.0, 1e20, 1e-40, 1e30, 1.0];
    let times = moderate.iter().cycle().take(32).chain(extreme.iter().cycle().take(40));
    let by = [0.0, 1e-3, 0.3, 2.0];
    let rows = noise.iter().zip(times).enumerate().map(|(n, (noise, &t))| {
        let by = by[if n < 32 { n % 3 } else { n % 4 }];
        common.iter().zip(noise).map(|(&c, &e)| t * c + by * e).collect::<Vec<f32>>()
    });
    let index = Index::new(dims, metric);
    rows.filter(|v| index.check_vector(v).is_ok()).collect()
}

/// Rows about a common part that vary mostly along a few directions (as
/// image patches do), at magnitudes across the numeric domain, some with
/// a little noise besides: the first 32 of moderate magnitudes, so that
/// the index (each row twice, `twins_of`) is centred from them at 64 rows
/// and keeps their main directions (`codes::DIRECTIONS`); the rest come
/// after. The common part and the directions are `shape`'s, the rest
/// `seed`'s.
fn in_few_directions((shape, seed): (u64, u64), dims: usize, metric: Metric) -> Vec<Vec<f32>> {
    let common: Vec<f32> = random_vectors(shape, dims, 1)[0].iter().map(|x| 3.0 + x).collect();
    let directions = random_vectors(shape + 1, dims, 3);
    let weights = random_vectors(seed + 2, 3, 72);
    let noise = random_vectors(seed + 3, dims, 72);
    let moderate = [0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 0.9];
    let extreme = [0.0, 1e-30, 7.9, 20.0, -3.0, 1e20, 1e-40, 1e30, 1.0];
    let times = moderate.iter().cycle().take(32).chain(extreme.iter().cycle().take(40));
    let by = [0.0, 1e-3, 0.05];
    let rows = noise.iter().zip(weights).zip(times).enumerate().map(|(n, ((noise, weights), &t))| {
        let mut row: Vec<f32> = common.iter().zip(noise).map(|(&c, &e)| t * c + by[n % 3] * e).collect();
        for (direction, w) in directions.iter().zip(weights) {
            row.iter_mut().zip(direction).for_each(|(x, &u)| *x += t * w * u);
        }
        row
    });
    let index = Index::new(dims, metric);
    rows.filter(|v| index.check_vector(v).is_ok()).collect()
}

/// `rows` as `metric` takes them: their magnitudes for js, which
/// refuses values below zero.
fn fit_for(metric: Metric, mut rows: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    if metric == Metric::JensenShannon {
        rows.iter_mut().flatten().for_each(|x| *x = x.abs());
    }
    rows
}

/// The int8 pass of `index` for `queries` with `kernel`: their codes
/// and bounds (products) or grids (floors), and their scales.
#[cfg(target_arch = "x86_64")]
struct Pass {
    codes: Vec<QueryCode>,
    bounds: Vec<codes::Bounds>,
    grids: Vec<Grids>,
    scales: Vec<f32>,
    kernel: cpu::Kernel,
    farthest: Vec<AtomicU32>,
}

#[cfg(target_arch = "x86_64")]
impl Pass {
    fn new(index: &Index, queries: &[&[f32]], kernel: cpu::Kernel) -> Pass {
        let squared: Vec<f64> = queries.iter().map(|query| kernels::squared_norm(query)).collect();
        let scales: Vec<f32> = squared.iter().map(|&squared| index.metric().query_scale(|| squared)).collect();
        let (mut codes, mut bounds, mut grids) = (Vec::new(), Vec::new(), Vec::new());
        match index.view().coded_pass().expect("an index with codes") {
            (Bound::Products(shape), _) => {
                let rows = index.view().codes.expect("codes");
                code_queries((shape, kernel, rows), queries, (&squared, &scales), (&mut codes, &mut bounds));
            }
            (Bound::Floors(floor), _) => {
                let rows = index.view().codes.expect("codes");
                grids = queries.iter().map(|query| Grids::of(floor, rows, query)).collect();
            }
        }
        Pass {
            codes,
            bounds,
            grids,
            scales,
            kernel,
            farthest: queries.iter().map(|_| AtomicU32::new(f32::INFINITY.to_bits())).collect(),
        }
    }

    fn coded(&self) -> Coded<'_> {
        let queries = if self.grids.is_empty() {
            CodedQueries::Products { codes: &self.codes, bounds: &self.bounds }
        } else {
            CodedQueries::Floors(&self.grids)
        };
        Coded { kernel: self.kernel, queries, farthest: &self.farthest }
    }
}

/// The index's codes; `None`, with a skip recorded, only where this CPU
/// has no int8 kernel at all, asked of the CPU itself: an index that
/// keeps no codes on a CPU that has one fails the test instead of
/// passing as skipped.
fn codes_or_skip<'a>(index: &'a Index, what: &str) -> Option<&'a Codes> {
    if cpu::Int8::ALL.iter().all(|isa| !isa.available()) {
        crate::testing::skip(what, "this CPU has no int8 kernel");
        return None;
    }
    let codes = index.view().codes;
    Some(codes.unwrap_or_else(|| panic!("{what}: the index keeps no codes, though this CPU has an int8 kernel")))
}

/// The kernels this CPU has; a skip, recorded, for each it has not.
#[cfg(target_arch = "x86_64")]
fn int8_kernels(what: &str) -> Vec<cpu::Kernel> {
    let here = crate::testing::on_this_cpu(&cpu::Int8::ALL, what, cpu::Int8::name, cpu::Int8::available);
    here.into_iter().map(|isa| cpu::Kernel::on_this_cpu(isa).expect("a kernel this CPU has")).collect()
}

/// The int8 kernels with lanes this CPU has (`int8_kernels`); where it has
/// none, `what` is recorded as skipped.
#[cfg(target_arch = "x86_64")]
fn kernels_with_lanes(what: &str) -> Vec<cpu::Kernel> {
    let kernels: Vec<cpu::Kernel> = int8_kernels(what).into_iter().filter(|k| k.has_lanes()).collect();
    if kernels.is_empty() {
        crate::testing::skip(what, "this CPU has no int8 kernel with lanes");
    }
    kernels
}

/// Every kernel's integer products against the scalar reference, and the
/// bound against each pair's own exact distance: with the threshold at
/// that distance, no row may be ruled out.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_int8_pass_never_rules_out_a_row_at_its_own_distance() {
    let kernels = int8_kernels("the int8 bound");
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        let dims = (1..=64).chain([65, 127, 768, 1536]);
        // Hard rows; rows along an offset; rows in a few directions.
        let sets = dims
            .flat_map(|dims| [(dims, 0), (dims, 1), (dims, 2)])
            .filter(|&(dims, set)| set == 0 || (dims % 7 == 1 || dims == 768) && (set == 1 || dims >= 16));
        for (dims, set) in sets {
            let rows_for = |seed| match set {
                0 => hard_for_codes(seed, dims, metric),
                1 => along_an_offset(seed, dims, metric),
                _ => in_few_directions((dims as u64, seed), dims, metric),
            };
            let index = twins_of(&rows_for(dims as u64), metric);
            let Some(codes) = codes_or_skip(&index, "the int8 bound") else { return };
            assert!(set != 1 || codes.has_multiples(), "{metric:?}, {dims} dims: rows along an offset have multiples");
            assert!(set != 2 || codes.has_directions(), "{metric:?}, {dims} dims: rows in a few directions keep them");
            let mut along = 0;
            for (q, mut query) in rows_for(1000 + dims as u64).into_iter().step_by(3).enumerate() {
                index.prepare_query(&mut query).unwrap();
                for &kernel in &kernels {
                    let pass = Pass::new(&index, &[&query], kernel);
                    let code = &pass.codes[0];
                    let scale = pass.scales[0];
                    along += usize::from(code.looks_along());
                    for row in 0..index.len() {
                        let mut top = TopK::new();
                        top.reset(1);
                        index.view().scan_exact(
                            &[&query],
                            &[scale],
                            None,
                            row..row + 1,
                            std::slice::from_mut(&mut top),
                        );
                        let exact = top.sorted()[0].distance;
                        let [dot] = kernel.dots_of(&pass.codes[0], codes, [row]);
                        let want = codes::dot_scalar(code.signs(), codes.row(row));
                        assert_eq!(dot, want, "{metric:?}, {dims} dims, {}", kernel.name());
                        let row_scale = if metric == Metric::Cosine { index.view().inverse_norms[row] } else { 1.0 };
                        let rows = ([index.view().norms[row]], [row_scale]);
                        assert!(
                            pass.bounds[0].rules_out(codes, [row], [[dot]], rows, [exact]) == [0],
                            "{metric:?}, {dims} dims, query {q}, row {row} ruled out at its own distance {exact}"
                        );
                        let terms = (row, rows.0[0], rows.1[0]);
                        assert!(
                            !pass.bounds[0].rules_out_finely((kernel, code, 0), codes, terms, exact),
                            "{metric:?}, {dims} dims, query {q}, row {row}: a second look rules it out at {exact}"
                        );
                    }
                }
            }
            // Most queries of moderate magnitudes look along the rows' main
            // directions.
            assert!(set != 2 || along >= kernels.len() * 4, "{metric:?}, {dims} dims: {along} looked along them");
        }
    }
}

/// On a kernel with lanes, the bound in registers rules out exactly the
/// rows the bound pair by pair rules out, at thresholds at each row's own
/// distance (where neither may rule it out), beside it, and at the
/// extremes, for rows and queries across the numeric domain.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_bound_in_lanes_is_the_bound_pair_by_pair() {
    let kernels = kernels_with_lanes("the bound in lanes");
    if kernels.is_empty() {
        return;
    }
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        for dims in [1, 7, 31, 32, 33, 50, 64, 65, 127, 257, 768] {
            let index = twins_of(&hard_for_codes(dims as u64, dims, metric), metric);
            let Some(codes) = codes_or_skip(&index, "the bound in lanes") else { return };
            let view = index.view();
            let row_scales = if metric == Metric::Cosine { view.inverse_norms } else { view.norms };
            let queries = hard_for_codes(2000 + dims as u64, dims, metric);
            for (q, mut query) in queries.into_iter().step_by(5).enumerate() {
                index.prepare_query(&mut query).unwrap();
                let scale = index.metric().query_scale(|| kernels::squared_norm(&query));
                let exact: Vec<f32> = (0..index.len())
                    .map(|row| {
                        let mut top = TopK::new();
                        top.reset(1);
                        view.scan_exact(&[&query], &[scale], None, row..row + 1, std::slice::from_mut(&mut top));
                        top.sorted()[0].distance
                    })
                    .collect();
                for &kernel in &kernels {
                    let pass = Pass::new(&index, &[&query], kernel);
                    for row in 0..=index.len() - LANES {
                        let lanes: [usize; LANES] = std::array::from_fn(|r| row + r);
                        let dots = kernel.dots_tile([&pass.codes[0]], codes, lanes);
                        let terms = (lanes.map(|r| view.norms[r]), lanes.map(|r| row_scales[r]));
                        let own = exact[row + q % LANES];
                        for threshold in [own, own.next_up(), own.next_down(), f32::INFINITY, 0.0, -f32::INFINITY] {
                            let want = pass.bounds[0].rules_out(codes, lanes, dots, terms, [threshold]);
                            let lanes = kernel.lanes(codes, (view.norms, row_scales)).expect("a kernel with lanes");
                            let got = lanes.rules_out(&lanes.query(&pass.codes[0], &pass.bounds[0], 0), row, threshold);
                            let what = format!("{metric:?}, {dims} dims, query {q}, rows from {row}, {threshold}");
                            assert_eq!(got, want[0], "{what}");
                            // A row's key is above the threshold exactly where the rule is.
                            let keys = lanes.keys(&lanes.query(&pass.codes[0], &pass.bounds[0], 0), row);
                            let above = (0..LANES).filter(|&r| keys[r] > threshold).fold(0, |m, r| m | 1 << r);
                            assert_eq!(above, got, "{what}: keys {keys:?}");
                            if threshold == own {
                                assert_eq!(got & (1 << (q % LANES)), 0, "{what}: ruled out at its own distance");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// With queries in lanes (`codes::query_lanes`), each pair's bound is the
/// bound of `Lanes`, bit for bit, and so the bound pair by pair; neither it
/// nor the group's first look is ever above the pair's own distance; and a
/// run rules out exactly the pairs of the rows whose first look rules out
/// every query, and elsewhere those whose bound is above their query's
/// threshold: for groups of 1 to 8 queries, rows of 1 to 255 dimensions
/// (every step's remainder), across the numeric domain and along an
/// offset.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_bound_with_queries_in_lanes_is_the_bound_in_lanes() {
    use crate::store::codes::query_lanes::{QueryGroup, QUERY_LANES};
    let kernels = kernels_with_lanes("the bound with queries in lanes");
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        for (dims, along) in [1, 2, 3, 4, 5, 7, 31, 32, 33, 50, 64, 65, 127, 200, 255]
            .map(|d| (d, false))
            .into_iter()
            .chain([(7, true), (50, true), (200, true)])
        {
            let rows = match along {
                false => hard_for_codes(dims as u64, dims, metric),
                true => along_an_offset(dims as u64, dims, metric),
            };
            let index = twins_of(&rows, metric);
            let Some(codes) = codes_or_skip(&index, "the bound with queries in lanes") else { return };
            let view = index.view();
            let row_scales = if metric == Metric::Cosine { view.inverse_norms } else { view.norms };
            let mut queries = match along {
                false => hard_for_codes(3000 + dims as u64, dims, metric),
                true => along_an_offset(3000 + dims as u64, dims, metric),
            };
            queries.truncate(3 * QUERY_LANES);
            for query in &mut queries {
                index.prepare_query(query).unwrap();
            }
            let exact = |query: &[f32], row: usize| {
                let scale = index.metric().query_scale(|| kernels::squared_norm(query));
                let mut top = TopK::new();
                top.reset(1);
                view.scan_exact(&[query], &[scale], None, row..row + 1, std::slice::from_mut(&mut top));
                top.sorted()[0].distance
            };
            for &kernel in &kernels {
                let lanes = kernel.lanes(codes, (view.norms, row_scales)).expect("a kernel with lanes");
                assert!(lanes.takes_query_groups(), "{dims} dimensions");
                let tile = kernel.query_tile();
                for size in [1, 2, 5, 8] {
                    let chosen: Vec<&[f32]> = queries.iter().step_by(3).take(size).map(Vec::as_slice).collect();
                    let pass = Pass::new(&index, &chosen, kernel);
                    let of = |q: usize| (&pass.codes[q], &pass.bounds[q / tile], q % tile);
                    let mut group = QueryGroup::default();
                    lanes.ready_group((0..size).map(of), &mut group);
                    assert_eq!(group.len(), size);
                    let whole = index.len() / LANES * LANES;
                    // Each row's own distance from each query, row by row.
                    let own: Vec<Vec<f32>> =
                        (0..whole).map(|row| chosen.iter().map(|q| exact(q, row)).collect()).collect();
                    // Whether a bound rules a pair out at a threshold.
                    let above = |key: f32, threshold: f32| key > threshold;
                    for (row, own) in own.iter().enumerate() {
                        let [keys, looks] = lanes.group_keys(&group, row);
                        for (q, (key, look)) in keys.iter().zip(looks).enumerate().take(size) {
                            let (first, r) = (row / LANES * LANES, row % LANES);
                            let single = lanes.query(&pass.codes[q], &pass.bounds[q / tile], q % tile);
                            let want = lanes.keys(&single, first)[r];
                            let what =
                                format!("{metric:?}, {dims} dims, {along}, {size} queries, query {q}, row {row}");
                            assert_eq!(key.to_bits(), want.to_bits(), "{what}: {key} against {want}");
                            assert!(!above(*key, own[q]), "{what}: ruled out at its own distance {}", own[q]);
                            assert!(!above(look, own[q]), "{what}: a first look of {look} above {}", own[q]);
                        }
                    }
                    // A run decides as the keys say: at each query's own
                    // distance to the run's first row, and beside it.
                    for shift in [0i32, 1, -1] {
                        let nudge = |t: f32| match shift {
                            1 => t.next_up(),
                            -1 => t.next_down(),
                            _ => t,
                        };
                        let thresholds: [f32; QUERY_LANES] =
                            std::array::from_fn(|q| if q < size { nudge(own[0][q]) } else { f32::NAN });
                        let mut heard = vec![Vec::new(); size];
                        let undecided = |q: usize, row: usize| {
                            heard[q].push(row);
                            thresholds[q]
                        };
                        lanes.rules_out_group_run(&group, 0..whole, thresholds, (|_| {}, undecided));
                        // Whether a row's first look rules out every query.
                        let settled = |looks: [f32; QUERY_LANES]| (0..size).all(|q| above(looks[q], thresholds[q]));
                        for (q, heard) in heard.iter().enumerate() {
                            let want: Vec<usize> = (0..whole)
                                .filter(|&row| {
                                    let [keys, looks] = lanes.group_keys(&group, row);
                                    !settled(looks) && !above(keys[q], thresholds[q])
                                })
                                .collect();
                            let what =
                                format!("{metric:?}, {dims} dims, {along}, {size} queries, query {q}, shift {shift}");
                            assert_eq!(heard, &want, "{what}");
                            assert!(shift == -1 || heard.first() == Some(&0), "{what}: row 0 at its own distance");
                        }
                    }
                }
            }
        }
    }
}

/// On rows and queries drawn alike, a group's first look settles nearly
/// every row its bounds rule out for all its queries, at each query's
/// tenth nearest: the first look is what decides a scan, and not only a
/// bound that is never above a pair's distance.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_group_s_first_look_settles_nearly_every_row_its_bounds_rule_out() {
    use crate::store::codes::query_lanes::{QueryGroup, QUERY_LANES};
    let kernels = kernels_with_lanes("a group's first look");
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        let dims = 50;
        let index = twins_of(&random_vectors(7, dims, 2000), metric);
        let Some(codes) = codes_or_skip(&index, "a group's first look") else { return };
        let view = index.view();
        let row_scales = if metric == Metric::Cosine { view.inverse_norms } else { view.norms };
        let mut queries = random_vectors(8, dims, QUERY_LANES);
        for query in &mut queries {
            index.prepare_query(query).unwrap();
        }
        let tenth: Vec<f32> = queries
            .iter()
            .map(|query| {
                let mut top = TopK::new();
                index.search(query, 10, &mut top);
                top.sorted()[9].distance
            })
            .collect();
        let chosen: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        for &kernel in &kernels {
            let lanes = kernel.lanes(codes, (view.norms, row_scales)).expect("a kernel with lanes");
            let tile = kernel.query_tile();
            let pass = Pass::new(&index, &chosen, kernel);
            let mut group = QueryGroup::default();
            lanes.ready_group((0..QUERY_LANES).map(|q| (&pass.codes[q], &pass.bounds[q / tile], q % tile)), &mut group);
            let (mut ruled, mut settled) = (0, 0);
            for row in 0..index.len() / LANES * LANES {
                let [keys, looks] = lanes.group_keys(&group, row);
                let all_above = |keys: [f32; QUERY_LANES]| (0..QUERY_LANES).all(|q| keys[q] > tenth[q]);
                ruled += usize::from(all_above(keys));
                settled += usize::from(all_above(looks));
            }
            let what = format!("{metric:?}, {}: {settled} rows settled, {ruled} ruled out", kernel.name());
            assert!(ruled * 10 >= index.len() * 9, "{what}");
            assert!(settled * 100 >= ruled * 98, "{what}");
        }
    }
}

/// Rows that share a large common part (every value near 3, as image
/// patches lie near their mean) are told apart by their centred codes: the
/// first pass rules most pairs out, as it does random rows, and finds
/// exactly what the f32 scan finds, in an index filled a row at a time
/// (centred as it grows) and in one loaded whole. So are rows that share it
/// at magnitudes from a quarter to twice (patches dark and bright): each is
/// coded from its own multiple of the offset.
#[cfg(target_arch = "x86_64")]
#[test]
fn centred_codes_rule_out_rows_that_share_a_common_part() {
    let kernels = int8_kernels("centred codes");
    let cases = [Metric::Cosine, Metric::Ip, Metric::L2].into_iter().flat_map(|metric| {
        [64, 192].into_iter().flat_map(move |dims| [false, true].map(|magnitudes| (metric, dims, magnitudes)))
    });
    for (metric, dims, magnitudes) in cases {
        let shifted = |seed, count| -> Vec<Vec<f32>> {
            let vectors = random_vectors(seed, dims, count);
            // From 1/4 to 2 where they vary: the floats are from -1 to 1.
            let times = random_vectors(seed + 1, 1, count).concat();
            let magnitude = |n: usize| if magnitudes { 1.125 + 0.875 * times[n] } else { 1.0 };
            let row = |(n, v): (usize, Vec<f32>)| v.iter().map(|x| magnitude(n) * (3.0 + 0.5 * x)).collect();
            vectors.into_iter().enumerate().map(row).collect()
        };
        let rows = shifted(dims as u64, 3000);
        let grown = twins_of(&rows, metric);
        let ids: Vec<i64> = (0..rows.len() as i64).collect();
        let metadata = vec![Default::default(); rows.len()];
        let loaded = Index::from_parts(dims, metric, ids, Aligned::from_slice(&rows.concat()), metadata).unwrap();
        for index in [&grown, &loaded] {
            let Some(codes) = codes_or_skip(index, "centred codes") else { return };
            // Each kernel's bound with and without them.
            assert_eq!(codes.has_multiples(), magnitudes, "{metric:?}, {dims} dims: rows' multiples");
            let (mut passed, mut rescored) = (0, 0);
            for mut query in shifted(9000 + dims as u64, 20) {
                index.prepare_query(&mut query).unwrap();
                let scale = index.metric().query_scale(|| kernels::squared_norm(&query));
                let scan = |coded: Option<&Coded>, top: &mut TopK| {
                    top.reset(10);
                    index.view().scan_exact(&[&query], &[scale], coded, 0..index.len(), std::slice::from_mut(top))
                };
                let mut want = TopK::new();
                scan(None, &mut want);
                for &kernel in &kernels {
                    let pass = Pass::new(index, &[&query], kernel);
                    let mut got = TopK::new();
                    let first = scan(Some(&pass.coded()), &mut got);
                    assert_eq!(got.sorted(), want.sorted(), "{metric:?}, {dims} dims, {}", kernel.name());
                    (passed, rescored) = (passed + first.rows, rescored + first.rescored);
                }
            }
            assert!(
                rescored * 20 < passed,
                "{metric:?}, {dims} dims, magnitudes {magnitudes}: {rescored} of {passed} rows rescored"
            );
        }
    }
}

/// Searches through the int8 pass, with every kernel this CPU has,
/// find exactly what the f32 scan finds: same ids, order and distances,
/// whole and masked. On random rows the pass must rule most rows out.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_int8_pass_finds_exactly_what_the_f32_scan_finds() {
    let kernels = int8_kernels("the int8 pass");
    let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
    let metrics = [
        Metric::Cosine,
        Metric::Ip,
        Metric::L2,
        Metric::L1,
        Metric::Linf,
        Metric::BrayCurtis,
        lp(1.5),
        lp(2.5),
        lp(3.0),
        Metric::Canberra,
        Metric::JensenShannon,
        lp(2.7),
    ];
    for metric in metrics {
        let Some(bound) = metric.first_pass() else {
            crate::testing::skip("the int8 pass, lp with p = 2.7", "this CPU has no AVX-512 VBMI lookups");
            continue;
        };
        // lp with a p not a multiple of 1/4 on the lookups' kernel only.
        let kernels: Vec<cpu::Kernel> = (kernels.iter().copied())
            .filter(|&kernel| !matches!(bound, Bound::Floors(floor) if !floor.runs_on(kernel.isa())))
            .collect();
        for dims in [1, 3, 17, 64, 100, 768] {
            let mut rows = hard_for_codes(dims as u64, dims, metric);
            rows.extend(fit_for(metric, random_vectors(7, dims, 2000)));
            let index = twins_of(&rows, metric);
            if codes_or_skip(&index, "the int8 pass").is_none() {
                return;
            }
            let mask: RoaringBitmap = (0..index.len() as u32).filter(|r| r % 3 != 0).collect();
            let mut queries = hard_for_codes(500 + dims as u64, dims, metric);
            queries.truncate(30);
            for query in &mut queries {
                index.prepare_query(query).unwrap();
            }
            let (mut passed, mut rescored) = (0, 0);
            for (q, query) in queries.iter().enumerate() {
                for k in [1, 10, 100] {
                    for mask in [None, Some(&mask)] {
                        let scale = index.metric().query_scale(|| kernels::squared_norm(query));
                        let scan = |coded: Option<&Coded>, top: &mut TopK| {
                            top.reset(k);
                            let top = std::slice::from_mut(top);
                            match mask {
                                Some(mask) => {
                                    index.view().scan_masked(&[query], &[scale], coded, mask, 0..index.len(), top)
                                }
                                None => index.view().scan_exact(&[query], &[scale], coded, 0..index.len(), top),
                            }
                        };
                        let mut want = TopK::new();
                        scan(None, &mut want);
                        for &kernel in &kernels {
                            let coded = Pass::new(&index, &[query], kernel);
                            let mut got = TopK::new();
                            let pass = scan(Some(&coded.coded()), &mut got);
                            let what = format!("{metric:?}, {dims} dims, query {q}, k {k}, {}", kernel.name());
                            assert_eq!(got.sorted(), want.sorted(), "{what}, masked {}", mask.is_some());
                            if (8..28).contains(&q) && k == 10 && mask.is_none() {
                                (passed, rescored) = (passed + pass.rows, rescored + pass.rescored);
                            }
                        }
                    }
                }
            }
            // The same queries as one batch, their ks mixed, the first 13
            // again at its end (so that a scan taking queries in groups
            // has more than one group, and in the second, under 256
            // dimensions, queries in lanes and queries alone): each answer
            // as the f32 batch scan gives it.
            let batch: Vec<&[f32]> = queries.iter().chain(&queries[..13]).map(Vec::as_slice).collect();
            for mask in [None, Some(&mask)] {
                let scan = |coded: Option<&Coded>, scales: &[f32]| {
                    let mut tops: Vec<TopK> = (0..batch.len()).map(|_| TopK::new()).collect();
                    for (q, top) in tops.iter_mut().enumerate() {
                        top.reset([1, 10, 100][q % 3]);
                    }
                    match mask {
                        Some(mask) => index.view().scan_masked(&batch, scales, coded, mask, 0..index.len(), &mut tops),
                        None => index.view().scan_exact(&batch, scales, coded, 0..index.len(), &mut tops),
                    };
                    tops
                };
                for &kernel in &kernels {
                    let pass = Pass::new(&index, &batch, kernel);
                    let (mut want, mut got) = (scan(None, &pass.scales), scan(Some(&pass.coded()), &pass.scales));
                    for (q, (got, want)) in got.iter_mut().zip(&mut want).enumerate() {
                        let what = format!("{metric:?}, {dims} dims, batch query {q}, {}", kernel.name());
                        assert_eq!(got.sorted(), want.sorted(), "{what}, masked {}", mask.is_some());
                    }
                }
            }
            // The random queries against mostly random rows: most rows
            // ruled out (one or two dimensions cannot tell rows apart).
            // js's bound is further below its distances (4.5% at 768
            // dimensions, against distances spread over 4%: `shannon`),
            // and these 2,000 rows hold the k nearest less far out.
            let share = if metric == Metric::JensenShannon { 5 } else { 10 };
            if dims >= 64 {
                assert!(rescored * share < passed, "{metric:?}, {dims} dims: {rescored} of {passed} rows rescored");
            }
        }
    }
}

/// Every kernel's integer distances between codes against the scalar
/// reference, and the floors' bound against each pair's own exact
/// distance: with the threshold at that distance, no row may be ruled
/// out.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_floors_never_rule_out_a_row_at_its_own_distance() {
    let kernels = int8_kernels("the floors' bound");
    let mut floors = vec![
        (Metric::L1, Floor::Steps(Step::L1)),
        (Metric::Linf, Floor::Steps(Step::Linf)),
        (Metric::BrayCurtis, Floor::Steps(Step::BrayCurtis)),
        (Metric::Canberra, Floor::Canberra),
        (Metric::JensenShannon, Floor::JensenShannon),
    ];
    for p in [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 7.75, 8.0] {
        floors.push((Metric::Lp(crate::store::Power::new(p).unwrap()), Floor::lp(p as f32).unwrap()));
    }
    // Any other p where the powers are looked up.
    for p in [1.1, 2.7, 7.99] {
        if let Some(floor) = Floor::lp(p as f32) {
            floors.push((Metric::Lp(crate::store::Power::new(p).unwrap()), floor));
        }
    }
    for (metric, floor) in floors {
        for dims in (1..=64).chain([65, 127, 768, 1536]) {
            let rows = hard_for_codes(dims as u64, dims, metric);
            let index = twins_of(&rows, metric);
            let Some(codes) = codes_or_skip(&index, "the floors' bound") else { return };
            for (q, query) in hard_for_codes(1000 + dims as u64, dims, metric).iter().step_by(3).enumerate() {
                let grids = Grids::of(floor, codes, query);
                for row in 0..index.len() {
                    let mut top = TopK::new();
                    top.reset(1);
                    index.view().scan_exact(&[query], &[1.0], None, row..row + 1, std::slice::from_mut(&mut top));
                    let exact = top.sorted()[0].distance;
                    let (d, m, p) = codes::floors::spans_scalar(&grids.code_for(codes, row), codes.row(row));
                    for &kernel in kernels.iter().filter(|&&kernel| floor.runs_on(kernel.isa())) {
                        let what = format!("{metric:?}, {dims} dims, query {q}, row {row}, {}", kernel.name());
                        let want = match floor {
                            Floor::Steps(Step::L1) => (d, 0),
                            Floor::Steps(Step::Linf) => (m, 0),
                            Floor::Steps(Step::BrayCurtis) => (d, p),
                            Floor::Lp(_) => {
                                // The sum within the slack the bound
                                // allows for (above) and as much below:
                                // none for p = 2 and 3, in integers.
                                let (sum, exact, slack, least) = grids.powers_of(kernel, codes, row);
                                assert!(sum <= exact * slack && sum >= least, "{what}: {sum} for {exact}");
                                (0, 0)
                            }
                            Floor::Canberra => {
                                let (sums, want, nearest) = grids.ratio_sums_of(kernel, codes, row);
                                assert_eq!(sums, want, "{what}");
                                assert!(nearest <= f64::from(exact), "{what}: {nearest} above {exact}");
                                (0, 0)
                            }
                            Floor::JensenShannon => {
                                let (sum, want, nearest) = grids.shannon_sums_of(kernel, codes, row);
                                assert_eq!(sum, want, "{what}");
                                assert!(nearest <= f64::from(exact), "{what}: {nearest} above {exact}");
                                (0, 0)
                            }
                        };
                        if !matches!(floor, Floor::Lp(_) | Floor::Canberra | Floor::JensenShannon) {
                            assert_eq!(grids.spans_of(kernel, codes, row), want, "{what}");
                        }
                        let ruled = grids.rules_out(kernel, codes, [row], exact);
                        assert_eq!(ruled, 0, "{what}: ruled out at its own distance {exact}");
                        // Nor beyond it by its key (searches in order).
                        let [key] = grids.keys_of(kernel, codes, [row]);
                        assert!(!grids.beyond(codes, row, key, exact), "{what}: key {key} beyond {exact}");
                    }
                }
            }
        }
    }
}

/// A lone search that scores rows in the order of their keys
/// (`search_in_order`) finds exactly what the f32 scan finds, on one
/// thread and on three taking a few rows at a time: every k from 1 to
/// more than the rows, rows in twins (ties broken by id), and rows at
/// every magnitude.
#[cfg(target_arch = "x86_64")]
#[test]
fn searches_in_the_order_of_their_bounds_find_what_the_f32_scan_finds() {
    let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
    let mut metrics = vec![Metric::L1, Metric::Linf, Metric::BrayCurtis, Metric::Canberra, Metric::JensenShannon];
    metrics.extend([lp(1.5), lp(2.0), lp(3.0)]);
    // lp with a p not a multiple of 1/4, where the CPU looks powers up.
    if Floor::lp(2.7).is_some() {
        metrics.push(lp(2.7));
    }
    for metric in metrics {
        for dims in [3, 64, 100] {
            let mut rows = hard_for_codes(40 + dims as u64, dims, metric);
            rows.extend(fit_for(metric, random_vectors(8, dims, 300)));
            let index = twins_of(&rows, metric);
            if codes_or_skip(&index, "searches in the order of their bounds").is_none() {
                return;
            }
            assert!(matches!(index.view().coded_pass(), Some((Bound::Floors(_), _))), "{metric:?}");
            let mut code = Buffers::default();
            for (q, query) in hard_for_codes(900 + dims as u64, dims, metric).iter().step_by(5).enumerate() {
                let mut query = query.clone();
                index.prepare_query(&mut query).unwrap();
                for k in [1, 10, 100, index.len(), index.len() + 5] {
                    let mut want = TopK::new();
                    index.search_f32(&query, k, &mut want);
                    for (threads, chunk) in [(1, 1 << 20), (3, 7)] {
                        let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new()]).collect();
                        let mut got = [TopK::new()];
                        let ks = [k];
                        let pass = index.view().search_in_chunks(
                            &[&query],
                            &ks,
                            &mut got,
                            (&mut partials, chunk),
                            None,
                            &mut code,
                        );
                        let what = format!("{metric:?}, {dims} dims, query {q}, k {k}, {threads} threads");
                        assert_eq!(got[0].sorted(), want.sorted(), "{what}");
                        assert_eq!(pass.rows, index.len() as u64, "{what}");
                    }
                }
            }
        }
    }
}

/// Where the bounds leave more than one row in `EXACT_SCAN_SHARE` (rows
/// alike to within less than a code's step), a search in order scans
/// every row exactly, on every thread, and finds what the f32 scan
/// finds: the nearest rows lie in every chunk, so a thread's kept rows
/// left out would show.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_search_in_order_of_rows_alike_scans_every_row_exactly() {
    let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
    let mut metrics = vec![Metric::L1, Metric::JensenShannon, lp(3.0)];
    if Floor::lp(2.7).is_some() {
        metrics.push(lp(2.7));
    }
    let rows = 3_000;
    let near = |i: usize| [0.5 + (i * 7_919 % 1_000) as f32 * 6e-8, 1.0, 2.0];
    for metric in metrics {
        let mut index = Index::new(3, metric);
        if codes_or_skip(&index, "a search in order of rows alike").is_none() {
            return;
        }
        assert!(matches!(index.view().coded_pass(), Some((Bound::Floors(_), _))), "{metric:?}");
        for id in 0..rows {
            index.upsert(id as i64, &near(id), b"");
        }
        let mut query = [0.5 + 500.3 * 6e-8, 1.0, 2.0];
        index.prepare_query(&mut query).unwrap();
        let mut code = Buffers::default();
        for k in [1, 10, 100] {
            let mut want = TopK::new();
            index.search_f32(&query, k, &mut want);
            for (threads, chunk) in [(1, 1 << 20), (3, 7)] {
                let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new()]).collect();
                let mut got = [TopK::new()];
                let pass =
                    index.view().search_in_chunks(&[&query], &[k], &mut got, (&mut partials, chunk), None, &mut code);
                let what = format!("{metric:?}, k {k}, {threads} threads");
                assert_eq!(got[0].sorted(), want.sorted(), "{what}");
                assert_eq!(pass.rescored, rows as u64, "{what}: every row scored");
            }
        }
    }
}

/// A lone search of a small index through the products' bound scores its
/// rows in the order of their bounds: on rows of small integers in
/// clusters (as scikit-learn's digits), it finds what the f32 scan finds,
/// on one thread and split, and scores a third or less of the rows that a
/// batch of the same query twice (the scan in the rows' order) scores.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_lone_search_of_a_small_index_scores_rows_in_the_order_of_their_bounds() {
    let (dims, rows) = (64, 1600);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let centres: Vec<Vec<f32>> = (0..10).map(|_| (0..dims).map(|_| next(17) as f32).collect()).collect();
    let mut near =
        |c: usize| -> Vec<f32> { centres[c].iter().map(|&x| (x + next(7) as f32 - 3.0).clamp(0.0, 16.0)).collect() };
    let vectors: Vec<Vec<f32>> = (0..rows + 20).map(|r| near(r % 10)).collect();
    for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
        let mut index = Index::new(dims, metric);
        for (id, v) in vectors[..rows].iter().enumerate() {
            index.upsert(id as i64, v, b"");
        }
        let Some((Bound::Products(_), kernel)) = index.view().coded_pass() else {
            crate::testing::skip("a lone search in order of the products' bound", "this CPU has no int8 kernel");
            return;
        };
        if !kernel.has_lanes() {
            crate::testing::skip(
                "a lone search in order of the products' bound",
                "this CPU's int8 kernel has no lanes",
            );
            return;
        }
        let mut buffers = Buffers::default();
        let (mut ordered, mut in_rows_order) = (0, 0);
        for query in &vectors[rows..] {
            let mut query = query.clone();
            index.prepare_query(&mut query).unwrap();
            let mut want = TopK::new();
            index.search_f32(&query, 10, &mut want);
            for (threads, chunk) in [(1, 1 << 20), (3, 100)] {
                let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new(), TopK::new()]).collect();
                let mut got = [TopK::new()];
                let parts = (&mut partials[..], chunk);
                let pass = index.view().search_in_chunks(&[&query], &[10], &mut got, parts, None, &mut buffers);
                assert_eq!(got[0].sorted(), want.sorted(), "{metric:?}, {threads} threads");
                ordered += pass.rescored;
                let mut twice = [TopK::new(), TopK::new()];
                let parts = (&mut partials[..], chunk);
                let pass =
                    index.view().search_in_chunks(&[&query, &query], &[10, 10], &mut twice, parts, None, &mut buffers);
                assert!(twice.iter_mut().all(|top| top.sorted() == want.sorted()), "{metric:?}, {threads} threads");
                in_rows_order += pass.rescored / 2;
            }
        }
        // Indexes about `LANES` rows, the least the ordered search takes,
        // find what the f32 scan finds.
        for rows in [1, LANES - 1, LANES, LANES + 1] {
            let mut small = Index::new(dims, metric);
            for (id, v) in vectors[..rows].iter().enumerate() {
                small.upsert(id as i64, v, b"");
            }
            let mut query = vectors[rows].clone();
            small.prepare_query(&mut query).unwrap();
            let (mut want, mut got) = (TopK::new(), [TopK::new()]);
            small.search_f32(&query, 10, &mut want);
            small.view().search_in_chunks(&[&query], &[10], &mut got, (&mut [], 1 << 20), None, &mut buffers);
            assert_eq!(got[0].sorted(), want.sorted(), "{metric:?}, {rows} rows");
        }
        // Measured: 0.8 to 2.0% of the rows in order, 5.8 to 8.3% in the rows' order.
        assert!(
            ordered * 3 < in_rows_order,
            "{metric:?}: {ordered} scored in order, {in_rows_order} in the rows' order"
        );
    }
}

/// Where the bounds tell no row apart (every row the same), a search
/// in order scores every row, and lets go of the room it took for them
/// past `LEFT_KEPT` rows: the scanner keeps only the rows' keys.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_search_in_order_lets_go_of_a_long_list_of_rows_left() {
    let rows = LEFT_KEPT + 4_000;
    let mut index = Index::new(3, Metric::L1);
    if codes_or_skip(&index, "a search in order's rows left").is_none() {
        return;
    }
    for id in 0..rows as i64 {
        index.upsert(id, &[0.5, -1.0, 2.0], b"");
    }
    let query = [0.25f32, -1.0, 2.5];
    let mut code = Buffers::default();
    let mut got = [TopK::new()];
    let pass = index.view().search_in_chunks(&[&query], &[1], &mut got, (&mut [], 1 << 20), None, &mut code);
    let mut want = TopK::new();
    index.search_f32(&query, 1, &mut want);
    assert_eq!(got[0].sorted(), want.sorted());
    assert_eq!(pass.rescored, rows as u64, "every row scored: none is beyond another");
    assert_eq!(code.order.left.capacity(), 0, "the list let go");
    assert!(code.order.keys.len() >= rows, "the keys kept");
}

/// The floors' codes follow upserts over rows of other magnitudes and
/// deletes (which move the last row into the gap): every scale keeps
/// its count of rows, so every row finds its query code, and searches
/// still find exactly what the f32 scan finds.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_floors_follow_upserts_and_deletes() {
    for metric in [Metric::L1, Metric::Canberra, Metric::JensenShannon] {
        floors_follow_upserts_and_deletes(metric);
    }
}

#[cfg(target_arch = "x86_64")]
fn floors_follow_upserts_and_deletes(metric: Metric) {
    let (dims, magnitudes) = (40, [1e-30f32, 1e-3, 1.0, 7.0, 3e16]);
    let rows = fit_for(metric, random_vectors(11, dims, 300));
    let scaled = |n: usize, v: &[f32]| -> Vec<f32> { v.iter().map(|x| x * magnitudes[n % 5]).collect() };
    let mut index = Index::new(dims, metric);
    if codes_or_skip(&index, "the floors' codes").is_none() {
        return;
    }
    for (n, v) in rows.iter().enumerate() {
        index.upsert(n as i64, &scaled(n, v), b"");
    }
    for (n, v) in rows.iter().enumerate().step_by(3) {
        index.upsert(n as i64, &scaled(n + 1, v), b"");
    }
    for id in (0..300).step_by(7) {
        index.delete(id);
    }
    let codes = index.view().codes.expect("codes");
    let mut counted = vec![0u32; 256];
    for row in 0..index.len() {
        counted[codes::exponent_of(codes.scale_and_residual(row).0)] += 1;
    }
    assert_eq!(codes.exponents(), &counted[..]);
    for (q, query) in fit_for(metric, random_vectors(12, dims, 10)).iter().enumerate() {
        let query = scaled(q, query);
        let (mut got, mut want) = (TopK::new(), TopK::new());
        index.search(&query, 10, &mut got);
        index.search_f32(&query, 10, &mut want);
        assert_eq!(got.sorted(), want.sorted(), "{metric:?}, query {q}");
    }
}

/// Canberra's codes count the rows that hold a negative value; while
/// neither they nor the query hold one, the kernels skip the signs (all
/// 0), and find the same sums and the same answers.
#[cfg(target_arch = "x86_64")]
#[test]
fn canberra_skips_the_signs_only_where_none_is_negative() {
    let kernels = int8_kernels("Canberra's signs");
    let dims = 100;
    let positive = |v: &Vec<f32>| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let rows: Vec<Vec<f32>> = hard_for_codes(5, dims, Metric::Canberra).iter().map(positive).collect();
    let mut index = twins_of(&rows, Metric::Canberra);
    let Some(codes) = codes_or_skip(&index, "Canberra's signs") else { return };
    assert_eq!(codes.negatives(), 0);
    let queries = hard_for_codes(6, dims, Metric::Canberra);
    for query in [positive(&queries[3]), queries[3].clone()] {
        let grids = Grids::of(Floor::Canberra, codes, &query);
        assert_eq!(grids.signed(), query.iter().any(|&x| x < 0.0));
        for row in 0..index.len() {
            for &kernel in &kernels {
                let (sums, want, _) = grids.ratio_sums_of(kernel, codes, row);
                assert_eq!(sums, want, "{}, row {row}", kernel.name());
            }
        }
    }
    // A row with a negative value turns the signs on for every query,
    // and its delete (or its overwrite) off again.
    let negative = queries[3].clone();
    index.upsert(-1, &negative, b"");
    index.upsert(-2, &negative, b"");
    index.upsert(-2, &positive(&negative), b"");
    let codes = index.view().codes.expect("codes");
    assert_eq!(codes.negatives(), 1);
    assert!(Grids::of(Floor::Canberra, codes, &positive(&queries[4])).signed());
    let (mut got, mut want) = (TopK::new(), TopK::new());
    index.search(&positive(&queries[4]), 5, &mut got);
    index.search_f32(&positive(&queries[4]), 5, &mut want);
    assert_eq!(got.sorted(), want.sorted());
    index.delete(-1);
    assert_eq!(index.view().codes.expect("codes").negatives(), 0);
}

/// Every kernel's products of a tile of queries with a tile of rows, at
/// every shape a scan uses (up to 4 x 4, where AVX-512 sums the 16 at
/// once), against the scalar reference, pair by pair.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_tile_of_queries_gets_each_pair_exactly() {
    fn check<const Q: usize, const R: usize>(kernel: cpu::Kernel, queries: &[QueryCode], codes: &Codes, at: usize) {
        let tile: [&QueryCode; Q] = std::array::from_fn(|q| &queries[(at + q) % queries.len()]);
        let rows: [usize; R] = std::array::from_fn(|r| (at * 7 + r * 3) % codes.rows());
        let dots = kernel.dots_tile(tile, codes, rows);
        for (q, code) in tile.iter().enumerate() {
            for (r, &row) in rows.iter().enumerate() {
                let want = codes::dot_scalar(code.signs(), codes.row(row));
                assert_eq!(dots[q][r], want, "{}, {Q} x {R}, query {q}, row {row}", kernel.name());
            }
        }
    }
    let kernels = int8_kernels("tiles of int8 products");
    for dims in (1..=64).chain([65, 127, 768, 1536]) {
        let Some(codes) = Codes::of(dims, codes::Grid::Fitted, &hard_for_codes(dims as u64, dims, Metric::Ip).concat())
        else {
            continue;
        };
        let queries = hard_for_codes(300 + dims as u64, dims, Metric::Ip);
        for &kernel in &kernels {
            let queries: Vec<QueryCode> = queries.iter().map(|q| QueryCode::of(q, kernel, &codes)).collect();
            for at in 0..5 {
                check::<4, 4>(kernel, &queries, &codes, at);
                check::<3, 4>(kernel, &queries, &codes, at);
                check::<2, 4>(kernel, &queries, &codes, at);
                check::<4, 1>(kernel, &queries, &codes, at);
                check::<1, 8>(kernel, &queries, &codes, at);
                check::<1, 1>(kernel, &queries, &codes, at);
            }
        }
    }
}

/// The most dimensions that keep codes: there the integer products of
/// saturated codes (every value ±127, offset 255) reach 2,122,383,360,
/// just inside an i32, and every kernel still sums them exactly, one
/// pair or a tile of 4 x 4 at a time; one dimension more keeps none.
#[cfg(target_arch = "x86_64")]
#[test]
fn codes_hold_exactly_up_to_their_dimension_limit() {
    let kernels = int8_kernels("the int8 dimension limit");
    let dims = codes::DIMS_MAX;
    let rows: Vec<f32> = [1.0, -1.0, -1.0, 1.0].iter().flat_map(|&x| vec![x; dims]).collect();
    // Pushed, not centred (an index centres its codes as it grows): every
    // code at its largest.
    let mut codes = codes::Codes::new(dims, codes::Grid::Fitted).expect("codes at the limit");
    rows.chunks_exact(dims).for_each(|row| codes.push(row));
    assert!(codes::Codes::of(dims + 1, codes::Grid::Fitted, &[0.5; codes::DIMS_MAX + 1]).is_none());
    for &kernel in &kernels {
        let queries = [1.0f32, -1.0, 1.0, -1.0].map(|x| QueryCode::of(&vec![x; dims], kernel, &codes));
        let tile = kernel.dots_tile(queries.each_ref(), &codes, [0, 1, 2, 3]);
        for (q, (code, tiled)) in queries.iter().zip(tile).enumerate() {
            for (row, tiled) in tiled.into_iter().enumerate() {
                let [dot] = kernel.dots_of(code, &codes, [row]);
                assert_eq!(dot, codes::dot_scalar(code.signs(), codes.row(row)), "{}", kernel.name());
                let levels = kernel.query_levels() as u32;
                assert_eq!(dot.unsigned_abs(), 127 * levels * dims as u32, "{}", kernel.name());
                assert_eq!(tiled, dot, "{}, query {q} of a tile", kernel.name());
            }
        }
    }
    if cpu::paths().int8().is_some() {
        assert!(Index::new(dims, Metric::Cosine).view().codes.is_some());
        assert!(Index::new(dims + 1, Metric::Cosine).view().codes.is_none());
    }
}

/// The floors' integer sums at 65,536 dimensions with every difference
/// at its largest, 254 (codes of 127 against queries clamped to -127):
/// `D` and `P` of 254 x 65,536 and lp's sum of 254^8 x 65,536 fit
/// their u32 and f32, on every kernel.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_floors_hold_exactly_up_to_the_dimension_limit() {
    let kernels = int8_kernels("the floors' dimension limit");
    let dims = codes::DIMS_MAX;
    // 127 is on its own scale, 1, with codes of 127.
    let rows: Vec<f32> = [127.0f32, -127.0].iter().flat_map(|&x| vec![x; dims]).collect();
    let codes_of = |floor: Floor| Codes::of(dims, floor.grid(), &rows).expect("codes at the limit");
    let query = vec![-1e30f32; dims];
    let (l1_codes, lp8) = (codes_of(Floor::Steps(Step::L1)), Floor::lp(8.0).unwrap());
    let lp8_codes = codes_of(lp8);
    for &kernel in &kernels {
        let grids = Grids::of(Floor::Steps(Step::BrayCurtis), &l1_codes, &query);
        assert_eq!(grids.spans_of(kernel, &l1_codes, 0), (254 * dims as u32, 0), "{}", kernel.name());
        assert_eq!(grids.spans_of(kernel, &l1_codes, 1), (0, 254 * dims as u32), "{}", kernel.name());
        let grids = Grids::of(Floor::Steps(Step::Linf), &l1_codes, &query);
        assert_eq!(grids.spans_of(kernel, &l1_codes, 0), (254, 0), "{}", kernel.name());
        let grids = Grids::of(lp8, &lp8_codes, &query);
        let (sum, exact, slack, least) = grids.powers_of(kernel, &lp8_codes, 0);
        assert!(sum.is_finite() && sum <= exact * slack && sum >= least, "{}: {sum} for {exact}", kernel.name());
        // p = 2 and 3 sum in integers, spilled from 32-bit lanes: exact
        // at the limit, every difference at its largest (254, lowered to
        // 127 for p = 2 and 181 for p = 3).
        for (p, s) in [(2.0, 127u64), (3.0, 181)] {
            let floor = Floor::lp(p).unwrap();
            let codes = codes_of(floor);
            let grids = Grids::of(floor, &codes, &query);
            let (sum, exact, slack, _) = grids.powers_of(kernel, &codes, 0);
            assert_eq!((sum, slack), (exact, 1.0), "{}, p {p}", kernel.name());
            assert_eq!(sum, (dims as u64 * s.pow(p as u32)) as f64, "{}, p {p}", kernel.name());
        }
    }
    // Canberra: every sign apart, or every level 255 from level 0 (m =
    // 255 either way), sums each table entry at its largest.
    let codes = Codes::of(dims, Floor::Canberra.grid(), &vec![1.0f32; dims]).expect("codes at the limit");
    for query in [vec![-1.0f32; dims], vec![1e-30; dims]] {
        let grids = Grids::of(Floor::Canberra, &codes, &query);
        for &kernel in &kernels {
            let (sums, want, nearest) = grids.ratio_sums_of(kernel, &codes, 0);
            let what = format!("{}, {}: {nearest}", kernel.name(), query[0]);
            assert_eq!(sums, want, "{what}");
            assert!(nearest <= dims as f64 && nearest > 0.98 * dims as f64, "{what}");
        }
    }
    // js: every level 255 against level 0 (m = 255, every `V` at its
    // largest), each term `ln 2 / 2` to within 2^-100, the bound's
    // 0.945 of it (level 0 holds values up to 2^(-255/32)).
    let query = vec![1e-30f32; dims];
    let codes = Codes::of(dims, Floor::JensenShannon.grid(), &vec![1.0f32; dims]).expect("codes at the limit");
    let grids = Grids::of(Floor::JensenShannon, &codes, &query);
    for &kernel in &kernels {
        let (sum, want, nearest) = grids.shannon_sums_of(kernel, &codes, 0);
        let what = format!("{}, js: {nearest}", kernel.name());
        assert_eq!((sum, want), (dims as u64 * 255 * 64, dims as u64 * 255 * 64), "{what}");
        let exact = dims as f64 * std::f64::consts::LN_2 / 2.0;
        assert!(nearest <= exact && nearest > 0.94 * exact, "{what}");
    }
}

/// Which lp indexes take the floors' pass: p a multiple of 1/4 from 1
/// to 8 (p = 1 on l1's floor), and any other p from 1 to 8 where the
/// first pass looks powers up; any other p keeps the f32 scan and no
/// codes.
#[test]
fn lp_takes_the_floors_pass_only_where_its_bound_is_proved() {
    assert_eq!(Floor::lp(1.0), Some(Floor::Steps(Step::L1)));
    for p in [1.25f32, 2.0, 2.5, 7.75, 8.0] {
        assert_eq!(Floor::lp(p), Some(Floor::Lp(p)));
    }
    let lookups = Floor::lp(2.7).is_some();
    for p in [1.1f32, 2.7, std::f32::consts::PI, 7.99] {
        assert_eq!(Floor::lp(p), lookups.then_some(Floor::Lp(p)));
        if lookups {
            assert!(Floor::Lp(p).runs_on(cpu::Int8::Vnni512) && !Floor::Lp(p).runs_on(cpu::Int8::Avx2));
        }
    }
    for p in [0.25f32, 0.75, 0.99, 8.25, 9.0] {
        assert_eq!(Floor::lp(p), None, "p = {p}");
        let index = Index::new(8, Metric::Lp(crate::store::Power::new(f64::from(p)).unwrap()));
        assert!(index.view().codes.is_none() && index.view().coded_pass().is_none(), "p = {p}");
    }
}

/// The queries' buffers a batch grew are kept for the next search, so a
/// steady load allocates nothing, and let go by `let_go` (after a large
/// request), so a batch of a thousand long queries does not stay resident.
#[test]
fn the_scanner_keeps_a_batch_s_buffers_until_let_go() {
    for metric in [Metric::Cosine, Metric::L1] {
        let index = twins_of(&random_vectors(5, 32, 200), metric);
        let queries = random_vectors(6, 32, 300);
        let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        let ks = vec![3; queries.len()];
        let mut tops: Vec<TopK> = queries.iter().map(|_| TopK::new()).collect();
        let mut scanner = Scanner::with_threads(1);
        scanner.search(index.view(), &queries, &ks, &mut tops, None);
        let kept = |scanner: &Scanner| {
            let buffers = &scanner.buffers;
            buffers.scales.capacity() + buffers.farthest.capacity() + buffers.codes.len() + buffers.grids.len()
        };
        assert!(kept(&scanner) >= 2 * queries.len(), "{metric:?}: the buffers are kept");
        scanner.let_go();
        assert_eq!(kept(&scanner), 0, "{metric:?}: the buffers are let go");
        assert!(scanner.buffers.screen.is_none() && scanner.together.tops.is_empty());
    }
}

/// On rows that share a common part at different magnitudes (image
/// patches, dark and bright), the second look rules out many of the rows
/// the first pass could not rule out against each query's k-th nearest
/// distance (leaving aside the rows within it, which neither may rule
/// out: `the_int8_pass_never_rules_out_a_row_at_its_own_distance`); where
/// the rows also vary mostly along a few directions (as image patches
/// do), looking along them, it rules out three in four or more.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_second_look_rules_out_many_rows_the_first_pass_leaves() {
    let kernels = int8_kernels("a second look");
    let dims = 192;
    let directions = random_vectors(9000, dims, 3);
    let alike = |seed, count, few: bool| -> Vec<Vec<f32>> {
        let vectors = random_vectors(seed, dims, count);
        let (times, weights) = (random_vectors(seed + 1, 1, count).concat(), random_vectors(seed + 2, 3, count));
        let row = |(n, v): (usize, Vec<f32>)| -> Vec<f32> {
            let part = |(i, x): (usize, &f32)| match few {
                false => 0.5 * x,
                true => 0.01 * x + (0..3).map(|j| 0.5 * weights[n][j] * directions[j][i]).sum::<f32>(),
            };
            v.iter().enumerate().map(|(i, x)| (1.125 + 0.875 * times[n]) * (3.0 + part((i, x)))).collect()
        };
        vectors.into_iter().enumerate().map(row).collect()
    };
    for (metric, few) in [Metric::Cosine, Metric::Ip, Metric::L2].into_iter().flat_map(|m| [(m, false), (m, true)]) {
        let index = twins_of(&alike(dims as u64, 1500, few), metric);
        let Some(codes) = codes_or_skip(&index, "a second look") else { return };
        assert_eq!(codes.has_directions(), few, "{metric:?}: main directions kept where they pay");
        let view = index.view();
        for &kernel in &kernels {
            let (mut left, mut looked) = (0, 0);
            for mut query in alike(7000, 10, few) {
                index.prepare_query(&mut query).unwrap();
                let scale = index.metric().query_scale(|| kernels::squared_norm(&query));
                let mut top = TopK::new();
                top.reset(10);
                view.scan_exact(&[&query], &[scale], None, 0..index.len(), std::slice::from_mut(&mut top));
                let tenth = top.threshold().expect("10 rows kept");
                let pass = Pass::new(&index, &[&query], kernel);
                for row in 0..index.len() {
                    let [dot] = kernel.dots_of(&pass.codes[0], codes, [row]);
                    let (_, norm, row_scale) = view.row_terms(row);
                    if pass.bounds[0].rules_out(codes, [row], [[dot]], ([norm], [row_scale]), [tenth]) == [1] {
                        continue;
                    }
                    let mut own = TopK::new();
                    own.reset(1);
                    view.scan_exact(&[&query], &[scale], None, row..row + 1, std::slice::from_mut(&mut own));
                    if own.sorted()[0].distance <= tenth {
                        continue;
                    }
                    left += 1;
                    let query = (kernel, &pass.codes[0], 0);
                    looked += usize::from(pass.bounds[0].rules_out_finely(query, codes, view.row_terms(row), tenth));
                }
            }
            let what = format!(
                "{metric:?}{}, {}: {looked} of {left} rows beyond the 10th the first pass left ruled out",
                if few { " in a few directions" } else { "" },
                kernel.name()
            );
            // Cosine divides by each row's norm: there the first pass leaves
            // rows beyond the 10th on every kernel. Where the kernel codes
            // queries on half a row's levels (AVX2), the query's rounding
            // is most of what it cannot tell, and the second look takes
            // it away (on these rows, a third to three quarters of them);
            // on 127 levels, less of it. Along the main directions, the
            // rows' own rounding goes too: three in four or more.
            assert!(left > 0 || metric != Metric::Cosine, "{what}");
            if few {
                assert!(looked * 4 >= left * 3, "{what}");
            } else {
                let share = if kernel.query_levels() < 127 { 3 } else { 4 };
                assert!(looked * share >= left, "{what}");
            }
            println!("{what}");
        }
    }
}

/// The ordered search through the products' bound, run directly on each
/// kernel with lanes this CPU has (whatever kernel the process chose): on
/// a small index and on one of long rows past the small ones' most
/// (`ORDERED_PRODUCTS_DIMS_MIN`), rows in clusters with a common part
/// (patches of a few kinds), it finds what the f32 scan finds, on one
/// thread and split, with its keys and its second looks, and scores half
/// or less of the rows the scan in the rows' order scores.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_ordered_search_on_each_kernel_with_lanes_finds_what_the_f32_scan_finds() {
    let kernels = kernels_with_lanes("the ordered search");
    if kernels.is_empty() {
        return;
    }
    for (dims, rows) in [(64, 1600), (ORDERED_PRODUCTS_DIMS_MIN, ORDERED_PRODUCTS_ROWS_MAX + 100)] {
        let centres = random_vectors(dims as u64, dims, 10);
        let noise = random_vectors(dims as u64 + 1, dims, rows + 12);
        let near = |(n, e): (usize, &Vec<f32>)| -> Vec<f32> {
            centres[n % 10].iter().zip(e).map(|(c, e)| 3.0 + c + 0.3 * e).collect()
        };
        let vectors: Vec<Vec<f32>> = noise.iter().enumerate().map(near).collect();
        for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
            let index = twins_of(&vectors[..rows / 2], metric);
            let Some(codes) = codes_or_skip(&index, "the ordered search") else { return };
            let view = index.view();
            let row_scales = if metric == Metric::Cosine { view.inverse_norms } else { view.norms };
            for &kernel in &kernels {
                let (mut ordered, mut in_rows_order) = (0, 0);
                for query in &vectors[rows..] {
                    let mut query = query.clone();
                    index.prepare_query(&mut query).unwrap();
                    let mut want = TopK::new();
                    index.search_f32(&query, 10, &mut want);
                    let pass = Pass::new(&index, &[&query], kernel);
                    let lanes = kernel.lanes(codes, (view.norms, row_scales)).expect("a kernel with lanes");
                    let lane_query = lanes.query(&pass.codes[0], &pass.bounds[0], 0);
                    let keyed = Keyed::Products(&lanes, &lane_query, (kernel, &pass.codes[0], &pass.bounds[0]));
                    let what = format!("{metric:?}, {dims} dims, {}", kernel.name());
                    for (threads, chunk) in [(1, 1 << 20), (3, 100)] {
                        let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new()]).collect();
                        let (mut top, mut order) = (TopK::new(), InOrder::default());
                        top.reset(10);
                        let lone = ((&query[..], &pass.scales[..]), &mut top, (&mut partials[..], chunk), &mut order);
                        let found = view.search_in_order(keyed, lone);
                        assert_eq!(top.sorted(), want.sorted(), "{what}, {threads} threads");
                        ordered += found.rescored;
                    }
                    let mut top = TopK::new();
                    top.reset(10);
                    let coded = pass.coded();
                    let scan = view.scan_exact(
                        &[&query],
                        &pass.scales,
                        Some(&coded),
                        0..index.len(),
                        std::slice::from_mut(&mut top),
                    );
                    assert_eq!(top.sorted(), want.sorted(), "{what}, in the rows' order");
                    in_rows_order += 2 * scan.rescored;
                }
                assert!(
                    ordered * 2 <= in_rows_order,
                    "{metric:?}, {dims} dims, {}: {ordered} scored in order, {in_rows_order} in the rows' order",
                    kernel.name()
                );
            }
        }
    }
}

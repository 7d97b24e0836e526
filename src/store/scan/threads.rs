//! The one way a scan goes onto threads (`on_threads`), and how the
//! threads of a split scan share each query's farthest kept.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::store::topk::TopK;

/// The farthest `top` keeps, or the one `farthest` shares (f32 bits),
/// whichever is nearer.
#[inline(always)]
pub(super) fn threshold_of(farthest: &AtomicU32, top: &TopK) -> f32 {
    let shared = f32::from_bits(farthest.load(Ordering::Relaxed));
    top.threshold().map_or(shared, |own| own.min(shared))
}

/// Shares `top`'s farthest kept in `farthest`, if nearer than the one
/// shared (the line is written only then). Kept distances are never NaN
/// (`TopK` ranks it as +inf).
#[inline(always)]
pub(super) fn share_in(farthest: &AtomicU32, top: &TopK) {
    if let Some(own) = top.threshold() {
        let _ = farthest.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |shared| {
            (own < f32::from_bits(shared)).then_some(own.to_bits())
        });
    }
}

/// Runs `work` on `tops`, and on the first `tops.len()` tops of each of
/// `partials` (`reset` first), each with its part's number and how many
/// parts there are: the one way a scan goes onto threads.
///
/// The parts are offered to the threads of rayon's pool, which live as
/// long as the process (`server::run` makes the pool and runs the loop on
/// one of its threads): no thread is started per search, and nothing is
/// allocated (`rayon::join` keeps its jobs on the stack). A part no other
/// thread takes in time runs on the calling thread after its own: the
/// scans share their rows through counters, so a part that starts late
/// finds fewer rows left, and the answer is the same.
pub(super) fn on_threads(
    tops: &mut [TopK],
    partials: &mut [Vec<TopK>],
    reset: impl Fn(&mut [TopK]) + Sync,
    work: impl Fn(&mut [TopK], usize, usize) + Sync,
) {
    let parts = partials.len() + 1;
    if parts == 1 {
        return work(tops, 0, 1);
    }
    let queries = tops.len();
    let (work, reset) = (&work, &reset);
    rayon::join(|| work(tops, 0, parts), || on_pool(partials, 1, (parts, queries), reset, work));
}

/// `on_threads`' parts `first..` on `partials`, halved until each is one.
pub(super) fn on_pool(
    partials: &mut [Vec<TopK>],
    first: usize,
    (parts, queries): (usize, usize),
    reset: &(impl Fn(&mut [TopK]) + Sync),
    work: &(impl Fn(&mut [TopK], usize, usize) + Sync),
) {
    match partials {
        [] => {}
        [partial] => {
            let own = &mut partial[..queries];
            reset(own);
            work(own, first, parts);
        }
        _ => {
            let (low, high) = partials.split_at_mut(partials.len() / 2);
            let middle = first + low.len();
            rayon::join(
                || on_pool(low, first, (parts, queries), reset, work),
                || on_pool(high, middle, (parts, queries), reset, work),
            );
        }
    }
}

/// `on_threads` for a lone search: `work` on `top`, and on each of
/// `partials`' first `TopK`, reset to `k`.
pub(super) fn in_parts(
    top: &mut TopK,
    partials: &mut [Vec<TopK>],
    k: usize,
    work: impl Fn(&mut TopK, usize, usize) + Sync,
) {
    let reset = |own: &mut [TopK]| own[0].reset(k);
    on_threads(std::slice::from_mut(top), partials, reset, |tops, part, parts| work(&mut tops[0], part, parts));
}

/// Offers what each of `partials`' first `TopK` kept (`in_parts`) to `top`.
pub(super) fn merge_partials(top: &mut TopK, partials: &mut [Vec<TopK>]) {
    for partial in partials {
        for &candidate in partial[0].sorted() {
            top.push(candidate);
        }
    }
}

/// Offers what each of `partials` kept for each query (`on_threads`) to
/// that query's top in `tops`.
pub(super) fn merge_each(tops: &mut [TopK], partials: &mut [Vec<TopK>]) {
    for partial in partials {
        for (top, partial) in tops.iter_mut().zip(partial.iter_mut()) {
            for &candidate in partial.sorted() {
                top.push(candidate);
            }
        }
    }
}

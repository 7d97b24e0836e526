//! A linearizability checker for one register (an id's row) per key: the
//! Wing–Gong search with memoized states (Lowe's refinement), over
//! histories recorded by real clients.
//!
//! An operation has its invocation and completion times; one whose
//! outcome is unknown (a write answered 503, or cut off) may have taken
//! effect at any time after its invocation, or never. A history is
//! linearizable if some order of its operations, each placed between its
//! invocation and completion, explains every outcome seen.

use std::collections::HashSet;
use std::time::Instant;

/// What an operation did to, or saw of, the register.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Set the value (an upsert of version `v`).
    Write(u64),
    /// Saw the value: `None` when the row was absent.
    Read(Option<u64>),
    /// Removed the row; `existed` says whether it was there.
    Delete { existed: bool },
    /// Removed the row, outcome unknown.
    DeleteMaybe,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub op: Op,
    pub invoked: Instant,
    /// `None`: the outcome is unknown (it may take effect at any later time, or never).
    pub completed: Option<Instant>,
}

/// The register's value after `op`, if `op` is possible from `state`.
fn step(state: Option<u64>, op: &Op) -> Option<Option<u64>> {
    match *op {
        Op::Write(v) => Some(Some(v)),
        Op::Read(seen) => (seen == state).then_some(state),
        Op::Delete { existed } => (existed == state.is_some()).then_some(None),
        Op::DeleteMaybe => Some(None),
    }
}

/// Whether `history` (one key's operations) is linearizable from an absent
/// row. Gives up (returns `Ok(false)` never; `Err`) past `budget` states.
pub fn check(history: &[Event], budget: usize) -> Result<bool, String> {
    let n = history.len();
    assert!(n <= 128, "histories are checked per key, at most 128 operations");
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| history[i].invoked);
    let mut seen: HashSet<(u128, Option<u64>)> = HashSet::new();
    // Depth-first: (linearized set, state).
    let mut stack: Vec<(u128, Option<u64>)> = vec![(0, None)];
    while let Some((done, state)) = stack.pop() {
        // Every operation with a known outcome is placed: the rest may never have happened.
        let open: Vec<usize> = order.iter().copied().filter(|&i| done & (1 << i) == 0).collect();
        if open.iter().all(|&i| history[i].completed.is_none()) {
            return Ok(true);
        }
        if !seen.insert((done, state)) {
            continue;
        }
        if seen.len() > budget {
            return Err(format!("more than {budget} states: a history too tangled to check"));
        }
        // Candidates: invoked before every open operation's completion.
        let horizon = open.iter().filter_map(|&i| history[i].completed).min();
        for &i in &open {
            if horizon.is_some_and(|h| history[i].invoked > h) {
                break;
            }
            if let Some(next) = step(state, &history[i].op) {
                stack.push((done | (1 << i), next));
            }
        }
    }
    Ok(false)
}

/// The checker refuses what it must, and accepts what it must.
#[test]
fn the_checker_tells_linearizable_histories_from_others() {
    use std::time::Duration;
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let event = |op, from, to: Option<u64>| Event { op, invoked: at(from), completed: to.map(at) };
    // A write, then a read that sees it.
    let good = [event(Op::Write(1), 0, Some(10)), event(Op::Read(Some(1)), 20, Some(30))];
    assert_eq!(check(&good, 10_000), Ok(true));
    // A read after a completed write that sees the older state: stale.
    let stale = [event(Op::Write(1), 0, Some(10)), event(Op::Read(None), 20, Some(30))];
    assert_eq!(check(&stale, 10_000), Ok(false));
    // Concurrent read: either value is fine.
    let overlap = [event(Op::Write(1), 0, Some(30)), event(Op::Read(None), 10, Some(20))];
    assert_eq!(check(&overlap, 10_000), Ok(true));
    // A write whose outcome is unknown may show up later...
    let maybe = [event(Op::Write(1), 0, None), event(Op::Read(Some(1)), 50, Some(60))];
    assert_eq!(check(&maybe, 10_000), Ok(true));
    // ...but not before it was invoked.
    let early = [event(Op::Read(Some(1)), 0, Some(10)), event(Op::Write(1), 20, None)];
    assert_eq!(check(&early, 10_000), Ok(false));
    // A value read, then an older one: not linearizable.
    let back = [
        event(Op::Write(1), 0, Some(10)),
        event(Op::Write(2), 20, Some(30)),
        event(Op::Read(Some(2)), 40, Some(50)),
        event(Op::Read(Some(1)), 60, Some(70)),
    ];
    assert_eq!(check(&back, 10_000), Ok(false));
    // A delete that found the row, after a write: fine; one that did not: not.
    let deleted = [event(Op::Write(1), 0, Some(10)), event(Op::Delete { existed: true }, 20, Some(30))];
    assert_eq!(check(&deleted, 10_000), Ok(true));
    let missed = [event(Op::Write(1), 0, Some(10)), event(Op::Delete { existed: false }, 20, Some(30))];
    assert_eq!(check(&missed, 10_000), Ok(false));
}

//! Search batching: searches that arrive in one turn of the loop are run
//! together, reading each index's rows once for all of them.
//!
//! The protocol, one turn at a time:
//!
//! 1. A complete search is decoded into a slot and parked (`Batches::park`)
//!    on its connection's [`Seat`]; the connection reads nothing more
//!    until it is answered.
//! 2. If the turn is worth waiting for (`Batches::gather_window`), the loop
//!    waits a moment for more searches, parking those that arrive.
//! 3. `Batches::run` runs every parked search not yet run, those on the
//!    same index with the same filter together (`run_together`, which
//!    runs the searches of a search-batch too). A change to the store runs
//!    the searches parked before it first, so that none sees a change that
//!    arrived after it; their answers are rendered at once (`Render::Now`),
//!    as the change may move or alter the rows they name.
//! 4. `Batches::answer` writes each answer into its connection's buffer:
//!    the hits of a search run at the end of the turn, after which nothing
//!    changes before the answers are written, straight from its top
//!    (`Render::AtAnswer`); one rendered before a change, copied.
//!    `Batches::end_turn` frees the slots for the next turn.
//!
//! The wait in step 2 is decided from the last turn: a client answered in a
//! run is expected to ask again at once, so while fewer of them have come
//! back than that run answered, and a search of this turn scans a large
//! index, a short wait lets a returning search share the pass over the rows.

use std::borrow::{Borrow, BorrowMut};
use std::time::{Duration, Instant};

use super::embeddings;
use super::group::{run_together, Ask, Slot};
use super::Reply;
use crate::metrics::Metrics;
use crate::store::{Filter, Index, Scanner, Store};

/// The longest the loop waits for more searches to join a batch.
const GATHER_WINDOW_MAX: Duration = Duration::from_millis(2);

/// A connection's place in the protocol: its search parked this turn, if
/// any, and the run that answered its last search.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seat {
    /// The slot of its parked search, and when that search was taken.
    parked: Option<(usize, Instant)>,
    answered_in: Option<u64>,
}

impl Seat {
    /// Whether a search of this connection waits to be run or answered.
    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
    }
}

/// A search parked by a connection this turn, and its answer.
#[derive(Default)]
struct Parked {
    search: Slot,
    keep_alive: bool,
    /// The answer and its status where it was rendered as soon as the
    /// search had run (`Render::Now`).
    reply: Vec<u8>,
    status: u16,
    /// Whether its answer is in `reply`.
    rendered: bool,
}

impl Borrow<Slot> for Parked {
    fn borrow(&self) -> &Slot {
        &self.search
    }
}

impl BorrowMut<Slot> for Parked {
    fn borrow_mut(&mut self) -> &mut Slot {
        &mut self.search
    }
}

/// When the answers of a run are rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Render {
    /// At once, into each search's own buffer: a change follows the run.
    Now,
    /// Into the connection's buffer when answered: nothing changes before.
    AtAnswer,
}

impl Parked {
    /// Renders the answer from the hits in `top` (or the error that they
    /// make too large a reply) into `reply`.
    fn render(&mut self, index: &Index, reply_bytes_max: usize) {
        self.reply.clear();
        self.status = write_answer(index, &mut self.search, self.keep_alive, reply_bytes_max, &mut self.reply);
        self.rendered = true;
    }
}

/// Writes the answer of a search that has run into `out` (or the error that
/// its hits make too large a reply); returns its status.
fn write_answer(index: &Index, search: &mut Slot, keep_alive: bool, reply_bytes_max: usize, out: &mut Vec<u8>) -> u16 {
    let ask = search.ask();
    match embeddings::write_hits(index, search.hits(), ask, reply_bytes_max, Reply { out, keep_alive }) {
        Ok(status) => status,
        Err(error) => error.write(out, keep_alive),
    }
}

/// The searches of this turn and what the last turns tell of the next.
#[derive(Default)]
pub struct Batches {
    /// Searches parked this turn: `parked[..parked_len]`.
    parked: Vec<Parked>,
    parked_len: usize,
    /// The last run: how many searches it answered, and how long they took.
    last_run: (usize, Duration),
    /// How many runs there have been: the last one's number.
    runs: u64,
    /// Searches parked this turn by clients answered in the last run.
    returned: usize,
    scanner: Scanner,
}

impl Batches {
    /// Batches whose scans use at most `threads` threads.
    pub fn with_threads(threads: usize) -> Batches {
        Batches { scanner: Scanner::with_threads(threads), ..Batches::default() }
    }

    /// The query buffer of the next slot: decode a search's query into it,
    /// then `park` it.
    pub fn next_query(&mut self) -> &mut Vec<f32> {
        if self.parked_len == self.parked.len() {
            self.parked.push(Parked::default());
        }
        self.parked[self.parked_len].search.query()
    }

    /// Parks the search whose query is in `next_query()`: what `ask` asks
    /// of the rows of the index `index` that `filter` matches (all if
    /// `None`; the keys it names indexed already), taken at `started`.
    pub fn park(
        &mut self,
        seat: &mut Seat,
        index: &str,
        ask: Ask,
        filter: Option<Filter>,
        keep_alive: bool,
        started: Instant,
    ) {
        debug_assert!(seat.parked.is_none(), "one parked search per connection");
        let slot = &mut self.parked[self.parked_len];
        slot.search.take(index, ask, filter);
        slot.keep_alive = keep_alive;
        slot.rendered = false;
        seat.parked = Some((self.parked_len, started));
        if seat.answered_in == Some(self.runs) {
            self.returned += 1;
        }
        self.parked_len += 1;
    }

    /// How long the loop may wait for more searches before running those
    /// parked: while fewer clients answered in the last run have come back
    /// than it answered (`gathering`), and a parked search still to run
    /// scans a large index, at most half the last run's time and
    /// `GATHER_WINDOW_MAX` (`window_after`). Searches that missed the last
    /// run and waited through it do not count as returned: they would
    /// otherwise stand in for clients still on their way, and every batch
    /// after one that some missed would be as short. A lone client never
    /// waits (it was alone last run too). Only searches still to run count:
    /// a change runs those parked before it, and the searches after it wait
    /// for its sync, so a turn with a change waits for nothing.
    pub fn gather_window(&self, store: &Store) -> Option<Duration> {
        if !self.gathering() {
            return None;
        }
        let large = |p: &Parked| !p.search.is_done() && store.index(p.search.index()).is_some_and(Index::is_large);
        self.parked[..self.parked_len].iter().any(large).then(|| window_after(self.last_run.1))
    }

    /// Whether fewer clients answered in the last run have searched again than it answered.
    pub fn gathering(&self) -> bool {
        self.returned < self.last_run.0
    }

    /// Runs every parked search not yet run: those on the same index with
    /// the same filter (or none) together, reading its rows once for all
    /// of them; their answers rendered as `render` says.
    pub fn run(&mut self, store: &Store, metrics: &mut Metrics, (render, reply_bytes_max): (Render, usize)) {
        let started = Instant::now();
        let parked = &mut self.parked[..self.parked_len];
        let to_run = parked.iter().filter(|p| !p.search.is_done()).count();
        if to_run == 0 {
            return;
        }
        run_together(&mut self.scanner, store, parked, |parked, index| {
            if render == Render::Now {
                parked.render(index, reply_bytes_max);
            }
        });
        metrics.add_search_work(self.scanner.take_work());
        self.last_run = (to_run, started.elapsed());
        self.runs += 1;
    }

    /// Writes the answer of the seat's parked search, which has run, into
    /// `out` (its hits from `store`'s index where it was not rendered);
    /// returns its status and when the search was taken. `None` if the
    /// seat has no parked search.
    pub fn answer(
        &mut self,
        seat: &mut Seat,
        (store, reply_bytes_max): (&Store, usize),
        out: &mut Vec<u8>,
    ) -> Option<(u16, Instant)> {
        let (slot, started) = seat.parked.take()?;
        let parked = &mut self.parked[slot];
        assert!(parked.search.is_done(), "a parked search is answered after it has run");
        if parked.rendered {
            out.extend_from_slice(&parked.reply);
        } else {
            let Some(index) = store.index(parked.search.index()) else {
                unreachable!("nothing changes between a run rendering at answer and the answers")
            };
            parked.status = write_answer(index, &mut parked.search, parked.keep_alive, reply_bytes_max, out);
        }
        seat.answered_in = Some(self.runs);
        Some((parked.status, started))
    }

    /// The scanner the batches use, for searches run at once.
    pub fn scanner(&mut self) -> &mut Scanner {
        &mut self.scanner
    }

    /// Forgets this turn's parked searches (their slots are kept for reuse).
    pub fn end_turn(&mut self) {
        self.parked_len = 0;
        self.returned = 0;
    }
}

/// The wait for more searches after a run that took `took`: half of it.
/// Python clients, whose interpreter runs one thread at a time, come back
/// one by one: with an eighth, 8 of them on GloVe's 399,000 x 50 were run
/// 4.7 to 4.9 at a time and answered 1,935 and 2,012 searches/s; with
/// half, 7.98 at a time and 2,059 and 2,125 (`real_data.py`'s clients,
/// builds taken in turn). A client that has gone costs one wait: the next
/// run expects as many as it answered.
fn window_after(took: Duration) -> Duration {
    (took / 2).min(GATHER_WINDOW_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::decode::Include;
    use crate::store::{Metric, Mutation};

    /// A store with a small index `small` and, when `large_rows` is not 0, an
    /// index `large` of that many 1024-dimension rows.
    fn store(large_rows: usize) -> Store {
        let mut store = Store::new();
        store.apply(&Mutation::CreateIndex { name: "small", dims: 2, metric: Metric::L2 });
        let small = store.index_mut("small").unwrap();
        for id in 0..50 {
            small.upsert(id, &[id as f32, (id % 7) as f32], b"");
        }
        if large_rows > 0 {
            store.apply(&Mutation::CreateIndex { name: "large", dims: 1024, metric: Metric::Ip });
            let large = store.index_mut("large").unwrap();
            for id in 0..large_rows as i64 {
                let row: Vec<f32> = (0..1024).map(|d| ((id * 7 + d) % 13) as f32 - 6.0).collect();
                large.upsert(id, &row, b"");
            }
            assert!(large.is_large());
        }
        store
    }

    fn park(batches: &mut Batches, seat: &mut Seat, index: &str, query: &[f32], k: usize) {
        park_asking(batches, seat, index, query, Ask { k, ..Ask::default() });
    }

    fn park_asking(batches: &mut Batches, seat: &mut Seat, index: &str, query: &[f32], ask: Ask) {
        let slot = batches.next_query();
        slot.clear();
        slot.extend_from_slice(query);
        batches.park(seat, index, ask, None, true, Instant::now());
    }

    fn answer(batches: &mut Batches, store: &Store, seat: &mut Seat) -> Vec<u8> {
        let mut out = Vec::new();
        let (status, _) = batches.answer(seat, (store, 1 << 20), &mut out).expect("a parked search");
        assert_eq!(status, 200);
        out
    }

    /// The answer each search gets alone, in a turn of its own.
    fn alone(store: &Store, index: &str, query: &[f32], k: usize) -> Vec<u8> {
        alone_asking(store, index, query, Ask { k, ..Ask::default() })
    }

    fn alone_asking(store: &Store, index: &str, query: &[f32], ask: Ask) -> Vec<u8> {
        let mut batches = Batches::with_threads(1);
        let mut seat = Seat::default();
        park_asking(&mut batches, &mut seat, index, query, ask);
        batches.run(store, &mut Metrics::default(), (Render::AtAnswer, 1 << 20));
        answer(&mut batches, store, &mut seat)
    }

    /// Parks a search with `filter` as `App` does: the keys it names are
    /// indexed now, the rows it matches found once for its group when it runs.
    fn park_filtered(batches: &mut Batches, seat: &mut Seat, store: &mut Store, query: &[f32], filter: &Filter) {
        store.index_mut("small").unwrap().index_keys(filter);
        let slot = batches.next_query();
        slot.clear();
        slot.extend_from_slice(query);
        let ask = Ask { k: 4, ..Ask::default() };
        batches.park(seat, "small", ask, Some(filter.clone()), true, Instant::now());
    }

    #[test]
    fn filtered_searches_share_their_group_s_rows_and_answer_as_alone() {
        let mut store = store(0);
        for id in 0..50 {
            let metadata = format!("{{\"m\":\"{}\"}}", id % 3);
            let vector = store.index("small").unwrap().get(id).unwrap().0.to_vec();
            store.index_mut("small").unwrap().upsert(id, &vector, metadata.as_bytes());
        }
        let filters = [Filter::Eq("m".into(), "1".into()), Filter::Not(Box::new(Filter::Eq("m".into(), "1".into())))];
        let queries: Vec<[f32; 2]> = (0..6).map(|q| [q as f32 * 7.5, (q % 4) as f32]).collect();
        let mut batches = Batches::with_threads(1);
        let mut seats = vec![Seat::default(); queries.len()];
        for (q, (seat, query)) in seats.iter_mut().zip(&queries).enumerate() {
            park_filtered(&mut batches, seat, &mut store, query, &filters[q % 2]);
        }
        batches.run(&store, &mut Metrics::default(), (Render::AtAnswer, 1 << 20));
        for (q, (seat, query)) in seats.iter_mut().zip(&queries).enumerate() {
            let together = answer(&mut batches, &store, seat);
            let mut lone = Batches::with_threads(1);
            let mut lone_seat = Seat::default();
            park_filtered(&mut lone, &mut lone_seat, &mut store, query, &filters[q % 2]);
            lone.run(&store, &mut Metrics::default(), (Render::AtAnswer, 1 << 20));
            let alone = answer(&mut lone, &store, &mut lone_seat);
            assert_eq!(together, alone, "query {q}");
            let text = String::from_utf8(together).unwrap();
            assert_eq!(text.matches("\"m\":\"1\"").count(), if q % 2 == 0 { 4 } else { 0 }, "{text}");
        }
    }

    #[test]
    fn searches_run_together_get_the_answers_each_gets_alone() {
        let store = store(0);
        let queries: Vec<[f32; 2]> = (0..9).map(|q| [q as f32 * 5.5, (q % 3) as f32]).collect();
        for threads in [1, 3] {
            let mut batches = Batches::with_threads(threads);
            let mut metrics = Metrics::default();
            let mut seats = vec![Seat::default(); queries.len()];
            // Every other search includes its scores and vectors.
            let ask =
                |q: usize| Ask { k: q + 1, include: Include { score: q % 2 == 1, data: q % 2 == 1 }, divisor: 1.0 };
            for (q, (seat, query)) in seats.iter_mut().zip(&queries).enumerate() {
                park_asking(&mut batches, seat, "small", query, ask(q));
            }
            batches.run(&store, &mut metrics, (Render::AtAnswer, 1 << 20));
            for (q, (seat, query)) in seats.iter_mut().zip(&queries).enumerate() {
                let answer = answer(&mut batches, &store, seat);
                assert_eq!(answer, alone_asking(&store, "small", query, ask(q)), "query {q}");
                let text = String::from_utf8(answer).unwrap();
                assert_eq!(text.contains("\"score\":") && text.contains("\"data\":"), q % 2 == 1, "{text}");
                assert!(!seat.is_parked());
            }
            batches.end_turn();
        }
    }

    #[test]
    fn a_search_is_answered_as_the_store_was_when_it_ran() {
        let mut store = store(0);
        let mut batches = Batches::default();
        let (mut before, mut after) = (Seat::default(), Seat::default());
        park(&mut batches, &mut before, "small", &[0.0, 0.0], 3);
        let expected = alone(&store, "small", &[0.0, 0.0], 3);
        // A change: what was parked before it runs first, rendered then.
        batches.run(&store, &mut Metrics::default(), (Render::Now, 1 << 20));
        store.index_mut("small").unwrap().upsert(-1, &[0.0, 0.0], b"");
        park(&mut batches, &mut after, "small", &[0.0, 0.0], 3);
        batches.run(&store, &mut Metrics::default(), (Render::AtAnswer, 1 << 20));
        assert_eq!(answer(&mut batches, &store, &mut before), expected, "the change came after it");
        assert_eq!(answer(&mut batches, &store, &mut after), alone(&store, "small", &[0.0, 0.0], 3));
        assert_ne!(expected, alone(&store, "small", &[0.0, 0.0], 3), "the change moves the answer");
    }

    /// A search run at the end of a turn is written once, into the
    /// connection's buffer; one run before a change is rendered then, and
    /// copied.
    #[test]
    fn hits_run_at_the_turn_s_end_are_written_once_into_the_connection() {
        let store = store(0);
        let mut batches = Batches::default();
        let mut seats = [Seat::default(); 2];
        park(&mut batches, &mut seats[0], "small", &[3.0, 1.0], 4);
        batches.run(&store, &mut Metrics::default(), (Render::Now, 1 << 20));
        park(&mut batches, &mut seats[1], "small", &[3.0, 1.0], 4);
        batches.run(&store, &mut Metrics::default(), (Render::AtAnswer, 1 << 20));
        assert!(batches.parked[0].rendered && !batches.parked[0].reply.is_empty());
        assert!(!batches.parked[1].rendered && batches.parked[1].reply.is_empty(), "nothing rendered yet");
        let expected = alone(&store, "small", &[3.0, 1.0], 4);
        assert_eq!(answer(&mut batches, &store, &mut seats[0]), expected);
        assert_eq!(answer(&mut batches, &store, &mut seats[1]), expected);
        assert!(batches.parked[1].reply.is_empty(), "written straight into the connection's buffer");
    }

    #[test]
    fn a_reply_too_large_is_answered_with_its_error() {
        let store = store(0);
        let mut batches = Batches::default();
        let mut seat = Seat::default();
        park(&mut batches, &mut seat, "small", &[1.0, 1.0], 50);
        batches.run(&store, &mut Metrics::default(), (Render::AtAnswer, 1000));
        let mut out = Vec::new();
        assert_eq!(batches.answer(&mut seat, (&store, 1000), &mut out).map(|(status, _)| status), Some(400));
        assert!(String::from_utf8(out).unwrap().contains("REPLY_TOO_LARGE"));
    }

    #[test]
    fn only_clients_answered_in_the_last_run_count_as_returned() {
        let store = store(0);
        let mut batches = Batches::default();
        let mut metrics = Metrics::default();
        let mut seats = [Seat::default(); 3];
        // Turn 1: two clients search and are answered.
        for seat in &mut seats[..2] {
            park(&mut batches, seat, "small", &[1.0, 2.0], 1);
        }
        batches.run(&store, &mut metrics, (Render::AtAnswer, 1 << 20));
        for seat in &mut seats[..2] {
            answer(&mut batches, &store, seat);
        }
        batches.end_turn();
        assert!(batches.gathering(), "none of the two has come back yet");
        // Turn 2: a third client, never answered, does not count; one of
        // the two does; then the other.
        park(&mut batches, &mut seats[2], "small", &[1.0, 2.0], 1);
        assert!(batches.gathering());
        park(&mut batches, &mut seats[0], "small", &[1.0, 2.0], 1);
        assert!(batches.gathering());
        let [_, second, _] = &mut seats;
        park(&mut batches, second, "small", &[1.0, 2.0], 1);
        assert!(!batches.gathering(), "both clients of the last run are back");
        batches.run(&store, &mut metrics, (Render::AtAnswer, 1 << 20));
        for seat in &mut seats {
            answer(&mut batches, &store, seat);
        }
        batches.end_turn();
        // Turn 3: the last run answered three.
        assert!(batches.gathering());
    }

    #[test]
    fn the_loop_waits_only_for_large_scans_still_to_run() {
        let store = store(PARALLEL_ROWS);
        let mut batches = Batches::default();
        let mut metrics = Metrics::default();
        let mut seats = [Seat::default(); 2];
        let query = vec![1.0; 1024];
        // Nothing parked, or a first lone client: no run has answered anyone.
        assert_eq!(batches.gather_window(&store), None);
        park(&mut batches, &mut seats[0], "large", &query, 5);
        assert_eq!(batches.gather_window(&store), None, "a lone client never waits");
        park(&mut batches, &mut seats[1], "large", &query, 5);
        batches.run(&store, &mut metrics, (Render::AtAnswer, 1 << 20));
        for seat in &mut seats {
            answer(&mut batches, &store, seat);
        }
        batches.end_turn();
        // Two were answered; one is back, on the large index: wait.
        park(&mut batches, &mut seats[0], "large", &query, 5);
        let window = batches.gather_window(&store).expect("a wait for the second client");
        assert!(window <= GATHER_WINDOW_MAX && window == window_after(batches.last_run.1));
        // Once it has run (a change ran it), nothing is left to wait for.
        batches.run(&store, &mut metrics, (Render::Now, 1 << 20));
        assert_eq!(batches.gather_window(&store), None, "a turn with a change waits for nothing");
        answer(&mut batches, &store, &mut seats[0]);
        batches.end_turn();
        // A search of a small index is not worth a wait (the client
        // answered in the last run has not come back).
        park(&mut batches, &mut seats[1], "small", &[1.0, 2.0], 5);
        assert!(batches.gathering());
        assert_eq!(batches.gather_window(&store), None);
    }

    /// Rows of 1024 floats that make an index large (`Index::is_large`).
    const PARALLEL_ROWS: usize = 4096;

    #[test]
    fn the_window_is_half_the_last_run_at_most_its_cap() {
        assert_eq!(window_after(Duration::from_micros(800)), Duration::from_micros(400));
        assert_eq!(window_after(Duration::from_millis(100)), GATHER_WINDOW_MAX);
        assert_eq!(window_after(Duration::ZERO), Duration::ZERO);
    }
}

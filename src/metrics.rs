//! Prometheus metrics, in the text exposition format.
//!
//! Everything is a plain integer in a fixed array, bumped by the one loop
//! thread: recording costs an add and no allocation; all formatting happens
//! when `/metrics` is scraped.

use std::time::Duration;

use crate::endpoint::Endpoint;
use crate::store::{Store, Work};

/// Requests are counted by endpoint, and in one more slot for those refused
/// before they had one.
const ROUTES: usize = Endpoint::ALL.len() + 1;

fn route_slot(route: Option<Endpoint>) -> usize {
    route.map_or(Endpoint::ALL.len(), |endpoint| endpoint as usize)
}

fn route_label(slot: usize) -> &'static str {
    Endpoint::ALL.get(slot).map_or("none", |endpoint| endpoint.label())
}

/// Every status the server answers with; anything else counts as `other`.
const STATUSES: [u16; 13] = [200, 400, 401, 404, 405, 408, 413, 431, 500, 503, 0, 0, 0];
const STATUS_SLOTS: usize = STATUSES.len();

/// Histogram bucket upper bounds, in microseconds.
const BUCKETS_US: [u64; 15] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 5_000_000];

#[derive(Clone, Copy, Default)]
struct Histogram {
    /// Per bucket (not cumulative); the last slot is above every bound.
    counts: [u64; BUCKETS_US.len() + 1],
    sum_us: u64,
}

impl Histogram {
    fn observe(&mut self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let slot = BUCKETS_US.iter().position(|&bound| us <= bound).unwrap_or(BUCKETS_US.len());
        self.counts[slot] += 1;
        self.sum_us += us;
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn render(&self, out: &mut Vec<u8>, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (slot, &bound) in BUCKETS_US.iter().enumerate() {
            cumulative += self.counts[slot];
            line(out, name, "_bucket", labels, Some(&format!("{}", bound as f64 / 1e6)), cumulative as f64);
        }
        line(out, name, "_bucket", labels, Some("+Inf"), self.count() as f64);
        line(out, name, "_sum", labels, None, self.sum_us as f64 / 1e6);
        line(out, name, "_count", labels, None, self.count() as f64);
    }
}

/// One sample line: `name{labels,le="..."} value`.
fn line(out: &mut Vec<u8>, name: &str, suffix: &str, labels: &str, le: Option<&str>, value: f64) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(suffix.as_bytes());
    if !labels.is_empty() || le.is_some() {
        out.push(b'{');
        out.extend_from_slice(labels.as_bytes());
        if let Some(le) = le {
            if !labels.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(b"le=\"");
            out.extend_from_slice(le.as_bytes());
            out.push(b'"');
        }
        out.push(b'}');
    }
    out.push(b' ');
    write_value(out, value);
    out.push(b'\n');
}

/// A sample value as Prometheus writes it: whole numbers without a
/// fraction, `NaN`, `+Inf` and `-Inf` by name, any other in shortest form.
fn write_value(out: &mut Vec<u8>, value: f64) {
    if value.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if value.is_infinite() {
        out.extend_from_slice(if value > 0.0 { b"+Inf" } else { b"-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        out.extend_from_slice(itoa::Buffer::new().format(value as i64).as_bytes());
    } else {
        out.extend_from_slice(ryu::Buffer::new().format_finite(value).as_bytes());
    }
}

/// A metric with one value and no labels: its header and its sample.
fn single(out: &mut Vec<u8>, name: &str, kind: &str, help: &str, value: f64) {
    header(out, name, kind, help);
    line(out, name, "", "", None, value);
}

fn header(out: &mut Vec<u8>, name: &str, kind: &str, help: &str) {
    out.extend_from_slice(format!("# HELP {name} {help}\n# TYPE {name} {kind}\n").as_bytes());
}

pub struct Metrics {
    requests: [[u64; STATUS_SLOTS + 1]; ROUTES],
    latency: [Histogram; ROUTES],
    search_work: Work,
    search_gathers: u64,
    search_gather_time: Duration,
    wal_appends: u64,
    wal_syncs: Histogram,
    wal_sync_failures: u64,
    open_connections: u64,
    connections_accepted: u64,
    connections_refused: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: [[0; STATUS_SLOTS + 1]; ROUTES],
            latency: [Histogram::default(); ROUTES],
            search_work: Work::default(),
            search_gathers: 0,
            search_gather_time: Duration::ZERO,
            wal_appends: 0,
            wal_syncs: Histogram::default(),
            wal_sync_failures: 0,
            open_connections: 0,
            connections_accepted: 0,
            connections_refused: 0,
        }
    }
}

impl Metrics {
    /// Counts a request answered for `route` (`None`: refused before it had one).
    pub fn observe_request(&mut self, route: Option<Endpoint>, status: u16, elapsed: Duration) {
        let slot = STATUSES.iter().position(|&s| s == status && s != 0).unwrap_or(STATUS_SLOTS);
        self.requests[route_slot(route)][slot] += 1;
        self.latency[route_slot(route)].observe(elapsed);
    }

    /// What searches read, and how many ran together (`Scanner::take_work`).
    pub fn add_search_work(&mut self, work: Work) {
        self.search_work += work;
    }

    /// A turn that waited `waited` for more searches to join its batch.
    pub fn search_gathered(&mut self, waited: Duration) {
        self.search_gathers += 1;
        self.search_gather_time += waited;
    }

    pub fn observe_sync(&mut self, records: u64, elapsed: Duration, ok: bool) {
        self.wal_appends += records;
        self.wal_syncs.observe(elapsed);
        if !ok {
            self.wal_sync_failures += 1;
        }
    }

    pub fn set_open_connections(&mut self, open: usize) {
        self.open_connections = open as u64;
    }

    pub fn connection_accepted(&mut self) {
        self.connections_accepted += 1;
    }

    pub fn connection_refused(&mut self) {
        self.connections_refused += 1;
    }

    /// The exposition text of every metric, with per-index figures from `store`.
    ///
    /// Longer than a function should be, for a reason: it is the list of
    /// the exposition's families in the order a scrape shows them, each a
    /// header and its lines, with nothing to decide between them; cut in
    /// parts, the list would be read in several places.
    pub fn render(&self, store: &Store, out: &mut Vec<u8>) {
        header(out, "quiver_requests_total", "counter", "Requests answered, by route and status.");
        for (route, counts) in self.requests.iter().enumerate() {
            for (slot, &count) in counts.iter().enumerate().filter(|(_, &c)| c > 0) {
                let status = if slot < STATUS_SLOTS { STATUSES[slot].to_string() } else { "other".to_owned() };
                let labels = format!("route=\"{}\",status=\"{status}\"", route_label(route));
                line(out, "quiver_requests_total", "", &labels, None, count as f64);
            }
        }
        header(
            out,
            "quiver_request_duration_seconds",
            "histogram",
            "Time to handle a request once it is received (a write's log sync is in quiver_wal_sync_duration_seconds).",
        );
        for (route, histogram) in self.latency.iter().enumerate().filter(|(_, h)| h.count() > 0) {
            histogram.render(out, "quiver_request_duration_seconds", &format!("route=\"{}\"", route_label(route)));
        }
        let work = &self.search_work;
        single(
            out,
            "quiver_search_scanned_bytes_total",
            "counter",
            "Bytes searches read: the two below together (a batch counts each of its searches).",
            (work.code_bytes + work.vector_bytes) as f64,
        );
        single(
            out,
            "quiver_search_code_bytes_total",
            "counter",
            "Bytes of int8 codes searches read in their first pass.",
            work.code_bytes as f64,
        );
        single(
            out,
            "quiver_search_vector_bytes_total",
            "counter",
            "Bytes of f32 vectors searches scored exactly: rows the first pass left, and rows scanned without one.",
            work.vector_bytes as f64,
        );
        single(
            out,
            "quiver_search_first_pass_rows_total",
            "counter",
            "Rows whose int8 codes a search read before deciding which to score exactly (a batch counts each of its searches).",
            work.first_pass.rows as f64,
        );
        single(
            out,
            "quiver_search_rescored_rows_total",
            "counter",
            "Rows of quiver_search_first_pass_rows_total that the int8 bound could not rule out, scored exactly in f32.",
            work.first_pass.rescored as f64,
        );
        single(
            out,
            "quiver_searches_batched_total",
            "counter",
            "Searches run together with others in one scan of an index: a search-batch's, or concurrent searches gathered.",
            work.batched_searches as f64,
        );
        single(
            out,
            "quiver_search_batches_total",
            "counter",
            "Scans that ran several searches together (so searches per batch is batched / batches).",
            work.batches as f64,
        );
        single(
            out,
            "quiver_search_gathers_total",
            "counter",
            "Turns that waited (at most 2 ms) for more searches to join a batch.",
            self.search_gathers as f64,
        );
        single(
            out,
            "quiver_search_gather_seconds_total",
            "counter",
            "Time spent in those waits.",
            self.search_gather_time.as_secs_f64(),
        );
        single(
            out,
            "quiver_wal_appends_total",
            "counter",
            "Records appended to the write-ahead log and synced.",
            self.wal_appends as f64,
        );
        single(
            out,
            "quiver_wal_sync_failures_total",
            "counter",
            "Failed log syncs (the server then refuses writes).",
            self.wal_sync_failures as f64,
        );
        header(out, "quiver_wal_sync_duration_seconds", "histogram", "Time to write and sync one tick's log records.");
        self.wal_syncs.render(out, "quiver_wal_sync_duration_seconds", "");
        single(out, "quiver_open_connections", "gauge", "Client connections open now.", self.open_connections as f64);
        single(
            out,
            "quiver_connections_accepted_total",
            "counter",
            "Client connections accepted.",
            self.connections_accepted as f64,
        );
        single(
            out,
            "quiver_connections_refused_total",
            "counter",
            "Connections refused for the connection limit.",
            self.connections_refused as f64,
        );
        header(out, "quiver_index_vectors", "gauge", "Embeddings stored, by index.");
        for (name, index) in store.indexes() {
            line(out, "quiver_index_vectors", "", &format!("index=\"{name}\""), None, index.len() as f64);
        }
        header(out, "quiver_index_vector_bytes", "gauge", "Bytes of vectors stored, by index.");
        for (name, index) in store.indexes() {
            let bytes = (index.len() * index.dims() * 4) as f64;
            line(out, "quiver_index_vector_bytes", "", &format!("index=\"{name}\""), None, bytes);
        }
        header(out, "quiver_index_code_bytes", "gauge", "Bytes of int8 codes kept for the first pass, by index.");
        for (name, index) in store.indexes() {
            let bytes = (index.len() * index.code_bytes_per_row()) as f64;
            line(out, "quiver_index_code_bytes", "", &format!("index=\"{name}\""), None, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Index, Metric};

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let mut metrics = Metrics::default();
        metrics.observe_request(Some(Endpoint::Search), 200, Duration::from_micros(70));
        metrics.observe_request(Some(Endpoint::Search), 200, Duration::from_millis(2));
        metrics.observe_request(None, 404, Duration::from_micros(3));
        metrics.observe_request(Some(Endpoint::Insert), 299, Duration::from_micros(3));
        metrics.observe_sync(5, Duration::from_millis(1), true);
        metrics.set_open_connections(3);
        let mut store = Store::new();
        let mut index = Index::new(4, Metric::L2);
        index.upsert(1, &[1.0; 4], b"");
        store.put_index("docs", index);
        let mut out = Vec::new();
        metrics.render(&store, &mut out);
        let text = String::from_utf8(out).unwrap();
        for expected in [
            "quiver_requests_total{route=\"search\",status=\"200\"} 2\n",
            "quiver_requests_total{route=\"none\",status=\"404\"} 1\n",
            "quiver_requests_total{route=\"insert\",status=\"other\"} 1\n",
            "quiver_request_duration_seconds_bucket{route=\"search\",le=\"0.0001\"} 1\n",
            "quiver_request_duration_seconds_bucket{route=\"search\",le=\"+Inf\"} 2\n",
            "quiver_request_duration_seconds_count{route=\"search\"} 2\n",
            "quiver_wal_appends_total 5\n",
            "quiver_wal_sync_duration_seconds_count 1\n",
            "quiver_open_connections 3\n",
            "quiver_index_vectors{index=\"docs\"} 1\n",
            "quiver_index_vector_bytes{index=\"docs\"} 16\n",
            "# TYPE quiver_request_duration_seconds histogram\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        // 4 code bytes, 8 of scale and bound and 8 of the centred norm and
        // offset product, where the CPU runs the pass.
        let codes = if crate::store::cpu::paths().int8().is_some() { 20 } else { 0 };
        assert!(text.contains(&format!("quiver_index_code_bytes{{index=\"docs\"}} {codes}\n")), "{text}");
    }

    #[test]
    fn values_are_written_as_prometheus_reads_them() {
        let written = |value: f64| {
            let mut out = Vec::new();
            write_value(&mut out, value);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(written(3.0), "3");
        assert_eq!(written(-2.0), "-2");
        assert_eq!(written(0.25), "0.25");
        assert_eq!(written(1e20), "1e20");
        assert_eq!(written(f64::NAN), "NaN");
        assert_eq!(written(f64::INFINITY), "+Inf");
        assert_eq!(written(f64::NEG_INFINITY), "-Inf");
    }
}

//! `quiver import` and `quiver export`: files of embeddings into and out of
//! a running server, over its HTTP API (the same calls any client makes).
//!
//! Import reads the file a batch at a time and sends the batches from
//! `--parallel` connections; a batch the server finds too large is split
//! and sent again, and one it refuses as a whole is split until the rows
//! at fault are found, so that every good row goes in. `--mode insert`
//! (the default) leaves rows already in the index as they are, so a second
//! run resumes an interrupted one; `--mode upsert` overwrites them. Export
//! reads the whole index from its snapshot download (one moment's rows, in
//! binary), or pages through the rows a `--filter` matches with scroll, and
//! writes them. Both end with a summary and exit 0 only when every
//! row went through.

pub mod client;
pub mod formats;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use client::{CallError, Client};
use formats::{Format, ReadOptions, Rows, Sink, Source};

/// The server, index and file format both tools take.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The index (to import into, it must exist with the file's dimensions).
    #[arg(long)]
    pub index: String,
    /// The API key (the read-only key may export, not import).
    #[arg(long, hide_env_values = true)]
    pub api_key: Option<String>,
    /// For an https:// URL: the certificates to trust (PEM), instead of the public
    /// authorities: the server's own self-signed certificate, or your CA's.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// The file's format; by default its extension says (.npy, .jsonl, .parquet).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
}

/// `quiver import`: a file's rows into an existing index of a running server.
#[derive(clap::Parser, Debug)]
#[command(name = "quiver import")]
pub struct ImportArgs {
    #[command(flatten)]
    pub target: Target,
    /// Rows whose id the index already holds: left as they are and counted
    /// (insert: a second run resumes a first), or overwritten (upsert).
    #[arg(long, value_enum, default_value_t = Mode::Insert)]
    pub mode: Mode,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
    /// Rows per request; by default about 4 MB of JSON each, at most 10,000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub batch_rows: Option<u32>,
    /// The id of a .npy's first row when no `<stem>.ids.npy` gives ids (the
    /// others follow it); for Parquet without an id column too.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub id_start: i64,
    /// Parquet: the column of ids.
    #[arg(long, default_value = "id")]
    pub id_column: String,
    /// Parquet: the column of vectors (by default the only list column).
    #[arg(long)]
    pub vector_column: Option<String>,
    /// The file to import.
    pub file: PathBuf,
}

/// `quiver export`: an index's rows, or those a filter matches, into a file.
#[derive(clap::Parser, Debug)]
#[command(name = "quiver export")]
pub struct ExportArgs {
    #[command(flatten)]
    pub target: Target,
    /// Only the rows this filter matches (the JSON of a search's `filter`).
    #[arg(long)]
    pub filter: Option<String>,
    /// The file to write (a .npy's ids go to `<stem>.ids.npy` beside it).
    pub file: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Insert,
    Upsert,
}

/// Runs `quiver import` or `quiver export` if `args` (the program's name
/// first) names one; returns its exit status, or `None` for anything else.
pub fn run(args: &[std::ffi::OsString]) -> Option<i32> {
    let which = args.get(1)?.to_str()?;
    if which == "import" || which == "export" {
        crate::memory::keep_freed();
    }
    let rest = || std::iter::once(std::ffi::OsString::from(format!("quiver {which}"))).chain(args[2..].iter().cloned());
    Some(match which {
        "import" => match parse::<ImportArgs>(rest()) {
            Ok(args) => import(&args),
            Err(error) => error.exit(),
        },
        "export" => match parse::<ExportArgs>(rest()) {
            Ok(args) => export(&args),
            Err(error) => error.exit(),
        },
        _ => return None,
    })
}

/// Parses a tool's flags, each with its environment variable (`--api-key`
/// is `QUIVER_API_KEY`, `--url` is `QUIVER_URL`).
fn parse<T: clap::Parser>(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<T, clap::Error> {
    let command = T::command().mut_args(|arg| match arg.get_long().map(crate::config::env_name) {
        Some(name) => arg.env(name),
        None => arg,
    });
    T::from_arg_matches(&command.try_get_matches_from(args)?)
}

fn key(given: &Option<String>) -> String {
    given.clone().unwrap_or_default()
}

fn progress(rows: Option<u64>, what: &str) -> indicatif::ProgressBar {
    let bar = match rows {
        Some(rows) => indicatif::ProgressBar::new(rows),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let template = match rows {
        Some(_) => "{msg} [{bar:30}] {human_pos}/{human_len} rows, {binary_bytes_per_sec}, ETA {eta}",
        None => "{msg} {spinner} {human_pos} rows, {binary_bytes_per_sec}",
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

/// What became of the rows of one request (or of its parts).
#[derive(Default)]
struct Outcome {
    rows: u64,
    applied: u64,
    present: u64,
    /// Rows refused, with why (at most `REASONS_KEPT` kept).
    refused: u64,
    reasons: Vec<String>,
    /// A call that failed outright (the server gone, an error not about rows).
    failure: Option<String>,
    vector_bytes: u64,
}

const REASONS_KEPT: usize = 20;

impl Outcome {
    fn add(&mut self, other: Outcome) {
        self.rows += other.rows;
        self.applied += other.applied;
        self.present += other.present;
        self.refused += other.refused;
        self.vector_bytes += other.vector_bytes;
        for reason in other.reasons {
            if self.reasons.len() < REASONS_KEPT {
                self.reasons.push(reason);
            }
        }
        if self.failure.is_none() {
            self.failure = other.failure;
        }
    }

    fn refuse(&mut self, reason: String) {
        self.refused += 1;
        if self.reasons.len() < REASONS_KEPT {
            self.reasons.push(reason);
        }
    }
}

/// Row `row`'s floats, if its vector came as floats.
fn floats_of(rows: &Rows, row: usize) -> Option<&[f32]> {
    let start = if row == 0 { 0 } else { rows.vector_ends.get(row - 1).copied().unwrap_or(0) };
    rows.vector_ends.get(row).map(|&end| &rows.values[start..end])
}

/// The rows of a batch worth sending; those whose floats JSON cannot hold
/// (not finite) are refused here, once.
fn sendable(rows: &Rows, outcome: &mut Outcome) -> Vec<usize> {
    let mut keep = Vec::with_capacity(rows.len());
    for row in 0..rows.len() {
        if floats_of(rows, row).is_some_and(|values| values.iter().any(|x| !x.is_finite())) {
            outcome.rows += 1;
            outcome.refuse(format!("id {}: a value is not a finite number", rows.ids[row]));
        } else {
            keep.push(row);
        }
    }
    keep
}

/// The body of an insert or upsert of rows `keep`: floats written shortest
/// (the server reads each back to the same f32), JSON text as written.
fn body(rows: &Rows, keep: &[usize]) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(rows.values.len() * 11 + rows.len() * 48 + 32);
    let mut vector_bytes = 0;
    out.extend_from_slice(b"{\"embeddings\":[");
    for (n, &row) in keep.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        out.extend_from_slice(itoa::Buffer::new().format(rows.ids[row]).as_bytes());
        out.extend_from_slice(b",\"data\":");
        match floats_of(rows, row) {
            Some(values) => {
                crate::api::json::write_f32_array(&mut out, values);
                vector_bytes += 4 * values.len() as u64;
            }
            None => {
                let text = &rows.texts[row];
                out.extend_from_slice(text.as_bytes());
                vector_bytes += 4 * (text.bytes().filter(|&b| b == b',').count() as u64 + 1);
            }
        }
        if !rows.metadata[row].is_empty() {
            out.extend_from_slice(b",\"metadata\":");
            out.extend_from_slice(rows.metadata[row].as_bytes());
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    (out, vector_bytes)
}

/// Sends rows `keep` of `rows`; splits the request where the server finds
/// it too large, or refuses it whole for a fault of some row.
fn send(client: &Client, path: &str, rows: &Rows, keep: &[usize], outcome: &mut Outcome) {
    if keep.is_empty() {
        return;
    }
    let (body, vector_bytes) = body(rows, keep);
    let sendable = keep.len() as u64;
    let mut tries = 0;
    let answer = loop {
        match client.call("PUT", path, Some(&body)) {
            Ok(answer) if answer.status == 503 && tries < 5 => {}
            Ok(answer) => break Ok(answer),
            Err(error) if tries < 2 => {
                let _ = error;
            }
            Err(error) => break Err(error),
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(200 << tries));
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(CallError { message, .. }) => {
            outcome.rows += keep.len() as u64;
            outcome.failure = Some(message);
            return;
        }
    };
    let too_large = answer.status == 413;
    if keep.len() > 1 && (too_large || answer.code() == "INVALID_REQUEST_BODY") {
        let (left, right) = keep.split_at(keep.len() / 2);
        send(client, path, rows, left, outcome);
        send(client, path, rows, right, outcome);
        return;
    }
    outcome.rows += keep.len() as u64;
    outcome.vector_bytes += vector_bytes;
    if too_large {
        // One row, still too large for the server's limits.
        outcome.refuse(format!("id {}: {}", rows.ids[keep[0]], answer.error_text()));
        return;
    }
    match (answer.status, answer.code()) {
        (200, _) => outcome.applied += sendable,
        (_, "EMBEDDINGS_SKIPPED") => {
            let reasons: Vec<&str> = answer.body["error"]["description"]
                .as_array()
                .map(|all| all.iter().filter_map(|r| r.as_str()).collect())
                .unwrap_or_default();
            let present = reasons.iter().filter(|r| r.ends_with("already exists")).count() as u64;
            outcome.present += present;
            outcome.applied += sendable.saturating_sub(reasons.len() as u64);
            for reason in reasons.iter().filter(|r| !r.ends_with("already exists")) {
                outcome.refuse((*reason).to_owned());
            }
        }
        (_, "INVALID_REQUEST_BODY") => {
            let detail = answer.body["error"]["detail"].as_str().unwrap_or_default();
            outcome.refuse(format!("id {}: {detail}", rows.ids[keep[0]]));
        }
        _ => outcome.failure = Some(answer.error_text()),
    }
}

/// The default rows per request: about 4 MB of JSON.
fn default_batch_rows(dims: usize) -> usize {
    ((4 << 20) / (dims * 11 + 48)).clamp(1, 10_000)
}

fn import(args: &ImportArgs) -> i32 {
    let started = Instant::now();
    let fail = |message: String| {
        eprintln!("quiver import: {message}");
        1
    };
    let format = match Format::of(&args.file, args.target.format) {
        Ok(format) => format,
        Err(error) => return fail(error),
    };
    let options = ReadOptions {
        id_start: args.id_start,
        id_column: &args.id_column,
        vector_column: args.vector_column.as_deref(),
    };
    let mut source = match Source::open(&args.file, format, &options) {
        Ok(source) => source,
        Err(error) => return fail(error),
    };
    let client = match Client::new(&args.target.url, &key(&args.target.api_key), args.target.ca_cert.as_deref()) {
        Ok(client) => client,
        Err(error) => return fail(error),
    };
    let dims = match client.dimensions(&args.target.index) {
        Ok(dims) => dims,
        Err(error) => return fail(format!("index '{}': {error}", args.target.index)),
    };
    if let Some(file_dims) = source.dims().filter(|&d| d != dims) {
        return fail(format!(
            "{}: vectors of {file_dims} dimensions; index '{}' has {dims}",
            args.file.display(),
            args.target.index
        ));
    }
    let batch_rows = args.batch_rows.map_or_else(|| default_batch_rows(dims), |n| n as usize);
    let verb = match args.mode {
        Mode::Insert => "insert",
        Mode::Upsert => "upsert",
    };
    let path = format!("/api/v1/embeddings/{}/{verb}", args.target.index);
    let bar = progress(source.rows(), "importing");
    let (jobs, queue) = mpsc::sync_channel::<Rows>(2 * args.parallel as usize);
    let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
    let (done, results) = mpsc::channel::<Outcome>();
    let mut total = Outcome::default();
    let mut read_error = None;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..args.parallel {
            let (queue, done, client, path, stop) = (queue.clone(), done.clone(), client.clone(), path.as_str(), &stop);
            scope.spawn(move || loop {
                let next = queue.lock().map(|queue| queue.recv());
                let Ok(Ok(rows)) = next else { return };
                if stop.load(Ordering::Relaxed) {
                    // A call failed: the rows still queued are not sent.
                    continue;
                }
                let mut outcome = Outcome::default();
                let keep = sendable(&rows, &mut outcome);
                send(&client, path, &rows, &keep, &mut outcome);
                if outcome.failure.is_some() {
                    stop.store(true, Ordering::Relaxed);
                }
                if done.send(outcome).is_err() {
                    return;
                }
            });
        }
        drop(done);
        let note = |outcome: Outcome, total: &mut Outcome| {
            bar.inc(outcome.rows);
            total.add(outcome);
            bar.set_message(format!("importing ({} MB)", total.vector_bytes >> 20));
        };
        loop {
            if total.failure.is_some() {
                break;
            }
            let mut rows = Rows::default();
            match source.next(batch_rows, &mut rows) {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    read_error = Some(error);
                    break;
                }
            }
            if jobs.send(rows).is_err() {
                break;
            }
            while let Ok(outcome) = results.try_recv() {
                note(outcome, &mut total);
            }
        }
        drop(jobs);
        for outcome in results.iter() {
            note(outcome, &mut total);
        }
    });
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let mb = total.vector_bytes as f64 / 1e6;
    eprintln!(
        "quiver import: {} rows of {} read into '{}' in {seconds:.2} s ({:.1} MB of vectors, {:.1} MB/s): {} {verb}ed, {} already present (left as they were), {} refused",
        total.rows,
        args.file.display(),
        args.target.index,
        mb,
        mb / seconds.max(1e-9),
        total.applied,
        total.present,
        total.refused,
    );
    for reason in &total.reasons {
        eprintln!("  refused: {reason}");
    }
    if total.refused as usize > total.reasons.len() {
        eprintln!("  ... and {} more refused", total.refused as usize - total.reasons.len());
    }
    let mut ok = total.refused == 0;
    if let Some(error) = &read_error {
        eprintln!(
            "quiver import: stopped reading: {error}; the {} rows before it were sent as counted above",
            total.rows
        );
        ok = false;
    }
    if let Some(failure) = &total.failure {
        eprintln!("quiver import: stopped: {failure}; the rows counted above were sent, the rest were not");
        ok = false;
    }
    i32::from(!ok)
}

#[derive(serde::Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    data: PageData<'a>,
}

#[derive(serde::Deserialize)]
struct PageData<'a> {
    #[serde(borrow)]
    embeddings: Vec<PageRow<'a>>,
    next: Option<i64>,
}

#[derive(serde::Deserialize)]
struct PageRow<'a> {
    id: i64,
    #[serde(borrow)]
    data: &'a serde_json::value::RawValue,
    #[serde(borrow)]
    metadata: Option<&'a serde_json::value::RawValue>,
}

/// A vector's JSON text, each number read straight to the nearest f32
/// (the server wrote each as the shortest text of its f32).
fn floats(text: &str, out: &mut Vec<f32>) -> Result<(), String> {
    let inner =
        text.trim().strip_prefix('[').and_then(|t| t.strip_suffix(']')).ok_or("a vector that is not an array")?;
    for number in inner.split(',').filter(|n| !n.trim().is_empty()) {
        out.push(number.trim().parse::<f32>().map_err(|_| format!("'{number}' is not a number"))?);
    }
    Ok(())
}

fn export(args: &ExportArgs) -> i32 {
    let started = Instant::now();
    let fail = |message: String| {
        eprintln!("quiver export: {message}");
        1
    };
    let format = match Format::of(&args.file, args.target.format) {
        Ok(format) => format,
        Err(error) => return fail(error),
    };
    let filter: Option<serde_json::Value> = match args.filter.as_deref().map(serde_json::from_str).transpose() {
        Ok(filter) => filter,
        Err(error) => return fail(format!("--filter: not JSON: {error}")),
    };
    let client = match Client::new(&args.target.url, &key(&args.target.api_key), args.target.ca_cert.as_deref()) {
        Ok(client) => client,
        Err(error) => return fail(error),
    };
    let stats = match client.call("GET", &format!("/api/v1/indexes/{}/stats", args.target.index), None) {
        Ok(answer) if answer.status == 200 => answer.body["data"].clone(),
        Ok(answer) => return fail(format!("index '{}': {}", args.target.index, answer.error_text())),
        Err(error) => return fail(format!("index '{}': {error}", args.target.index)),
    };
    let dims = stats["dimensions"].as_u64().unwrap_or(0) as usize;
    let count = stats["count"].as_u64();
    let mut sink = match Sink::create(&args.file, format, dims) {
        Ok(sink) => sink,
        Err(error) => return fail(error),
    };
    let bar = progress(if filter.is_some() { None } else { count }, "exporting");
    if filter.is_none() {
        // The whole index: its snapshot, one moment's rows, in one binary read.
        let written = match from_snapshot(&client, (&args.target.index, dims), &mut sink, &bar) {
            Ok(written) => written,
            Err(error) => return fail(error),
        };
        return finish_export(args, sink, bar, written, started);
    }
    let limit = ((16 << 20) / (dims * 12 + 64)).clamp(1, 10_000);
    let path = format!("/api/v1/embeddings/{}/scroll", args.target.index);
    let (mut after, mut rows, mut written, mut bytes) = (None::<i64>, Rows::default(), 0u64, 0u64);
    loop {
        let mut request = serde_json::json!({"limit": limit, "include": ["data"]});
        if let Some(filter) = &filter {
            request["filter"] = filter.clone();
        }
        if let Some(after) = after {
            request["after"] = after.into();
        }
        let reply = match client.call_bytes("POST", &path, Some(request.to_string().as_bytes())) {
            Ok((200, reply)) => reply,
            Ok((status, reply)) => {
                let body: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_default();
                let answer = client::Answer { status, body };
                return fail(format!("after {written} rows: {}", answer.error_text()));
            }
            Err(error) => return fail(format!("after {written} rows: {error}")),
        };
        let page: Page<'_> = match serde_json::from_slice(&reply) {
            Ok(page) => page,
            Err(error) => return fail(format!("after {written} rows: a scroll answer that does not read: {error}")),
        };
        rows.clear();
        for row in &page.data.embeddings {
            if let Err(error) = floats(row.data.get(), &mut rows.values) {
                return fail(format!("id {}: {error}", row.id));
            }
            rows.vector_ends.push(rows.values.len());
            rows.ids.push(row.id);
            let metadata = row.metadata.map(|m| m.get()).filter(|m| *m != "{}" && *m != "null").unwrap_or("");
            rows.metadata.push(metadata.to_owned());
        }
        // Counted first: the sink may take the batch's arrays.
        let (count, values) = (rows.len() as u64, rows.values.len() as u64);
        if let Err(error) = sink.write(&mut rows) {
            return fail(error);
        }
        written += count;
        bytes += 4 * values;
        bar.inc(count);
        match page.data.next {
            Some(next) if !page.data.embeddings.is_empty() => after = Some(next),
            _ => break,
        }
    }
    finish_export(args, sink, bar, (written, bytes), started)
}

/// An index's rows from its snapshot download, into `sink`; how many rows
/// and vector bytes.
fn from_snapshot(
    client: &Client,
    (index, dims): (&str, usize),
    sink: &mut Sink,
    bar: &indicatif::ProgressBar,
) -> Result<(u64, u64), String> {
    let (status, image) =
        client.call_bytes("GET", &format!("/api/v1/indexes/{index}/snapshot"), None).map_err(|e| e.to_string())?;
    if status != 200 {
        let body = serde_json::from_slice(&image).unwrap_or_default();
        return Err(format!("index '{index}': {}", client::Answer { status, body }.error_text()));
    }
    let image = crate::snapshot::image_rows(&image).map_err(|why| format!("index '{index}': its snapshot: {why}"))?;
    if image.dims != dims {
        return Err(format!(
            "index '{index}' has {} dimensions now, not {dims}: it was made again; export again",
            image.dims
        ));
    }
    let mut rows = Rows::default();
    let row_bytes = image.dims * 4;
    for (chunk, ids) in image.ids.chunks(EXPORT_BATCH_ROWS).enumerate() {
        rows.clear();
        let first = chunk * EXPORT_BATCH_ROWS;
        rows.ids.extend_from_slice(ids);
        let bytes = &image.vectors[first * row_bytes..(first + ids.len()) * row_bytes];
        rows.values.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))));
        rows.vector_ends.extend((1..=ids.len()).map(|n| n * image.dims));
        for text in &image.metadata[first..first + ids.len()] {
            rows.metadata.push(String::from_utf8_lossy(text).into_owned());
        }
        sink.write(&mut rows)?;
        bar.inc(ids.len() as u64);
    }
    Ok((image.ids.len() as u64, image.vectors.len() as u64))
}

/// Rows an export writes at a time.
const EXPORT_BATCH_ROWS: usize = 8192;

fn finish_export(
    args: &ExportArgs,
    sink: Sink,
    bar: indicatif::ProgressBar,
    (written, bytes): (u64, u64),
    started: Instant,
) -> i32 {
    let dropped_metadata = match sink.finish() {
        Ok(n) => n,
        Err(error) => {
            eprintln!("quiver export: {error}");
            return 1;
        }
    };
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let mb = bytes as f64 / 1e6;
    eprintln!(
        "quiver export: {written} rows of '{}' written to {} in {seconds:.2} s ({mb:.1} MB of vectors, {:.1} MB/s)",
        args.target.index,
        args.file.display(),
        mb / seconds.max(1e-9)
    );
    if dropped_metadata > 0 {
        eprintln!("quiver export: a .npy holds no metadata: that of {dropped_metadata} rows is not in the file (use .jsonl or .parquet)");
    }
    0
}

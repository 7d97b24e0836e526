//! Operator logs: one line each on standard error, at a level `--log-level`
//! chooses, and warnings about clients rate-limited so that abuse cannot
//! flood the log.
//!
//! Each line is an event: a short stable name (`listening`, `snapshot_written`)
//! that a log pipeline can filter on, a message for people, and for some
//! events named fields. `--log-format text` writes the message alone;
//! `--log-format json` one object a line with all of them and the time:
//! `{"time":"2026-11-27T21:00:00.123Z","level":"info","event":"listening","message":"...","address":"..."}`.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::api::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

/// `--log-format`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `quiver: <message>`, with `warning: ` and the like before the message.
    Text,
    /// One JSON object a line: time, level, event, message and the event's fields.
    Json,
}

/// A named value of an event, written as a JSON string.
pub type Field<'a> = (&'static str, &'a dyn fmt::Display);

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static FORMAT: AtomicU8 = AtomicU8::new(Format::Text as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn set_format(format: Format) {
    FORMAT.store(format as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one event, whatever the level allows (the callers ask).
fn write(level: Level, event: &str, fields: &[Field<'_>], message: fmt::Arguments<'_>) {
    let mut line = Vec::with_capacity(256);
    if FORMAT.load(Ordering::Relaxed) == Format::Json as u8 {
        json_line(&mut line, (SystemTime::now(), level, event), fields, message);
    } else {
        let tag = match level {
            Level::Error => "error: ",
            Level::Warn => "warning: ",
            Level::Info => "",
            Level::Debug => "debug: ",
        };
        let _ = writeln!(line, "quiver: {tag}{message}");
    }
    // One write of the whole line, so that lines of two threads never mix.
    let _ = io::stderr().lock().write_all(&line);
}

/// The JSON form of an event, newline included.
fn json_line(
    out: &mut Vec<u8>,
    (time, level, event): (SystemTime, Level, &str),
    fields: &[Field<'_>],
    message: fmt::Arguments<'_>,
) {
    out.extend_from_slice(b"{\"time\":\"");
    let _ = write!(out, "{}", humantime::format_rfc3339_millis(time));
    out.extend_from_slice(b"\",\"level\":\"");
    out.extend_from_slice(match level {
        Level::Error => b"error",
        Level::Warn => b"warn",
        Level::Info => b"info",
        Level::Debug => b"debug",
    });
    out.extend_from_slice(b"\",\"event\":");
    json::write_str(out, event);
    out.extend_from_slice(b",\"message\":");
    json::write_fmt_str(out, message);
    for (name, value) in fields {
        out.push(b',');
        json::write_str(out, name);
        out.push(b':');
        json::write_fmt_str(out, format_args!("{value}"));
    }
    out.extend_from_slice(b"}\n");
}

/// An event with named fields (`Field`), if `level` is logged.
pub fn event(level: Level, event: &str, fields: &[Field<'_>], message: fmt::Arguments<'_>) {
    if enabled(level) {
        write(level, event, fields, message);
    }
}

pub fn info(event: &str, message: fmt::Arguments<'_>) {
    self::event(Level::Info, event, &[], message);
}

/// What an operator looks at to follow the traffic: each request, each
/// commit of the log. Callers ask `enabled(Level::Debug)` first where
/// gathering the fields costs anything.
pub fn debug(event: &str, message: fmt::Arguments<'_>) {
    self::event(Level::Debug, event, &[], message);
}

/// The start-up banner (address, data directory, API key): written at
/// every level (as `info`), because operators need the key and the
/// contract promises it.
pub fn banner(event: &str, fields: &[Field<'_>], message: fmt::Arguments<'_>) {
    write(Level::Info, event, fields, message);
}

pub fn warn(event: &str, message: fmt::Arguments<'_>) {
    self::event(Level::Warn, event, &[], message);
}

pub fn error(event: &str, message: fmt::Arguments<'_>) {
    self::event(Level::Error, event, &[], message);
}

/// Lets through at most `per_second` warnings a second; says how many it
/// held back when the next second begins.
pub struct Limiter {
    per_second: u32,
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl Limiter {
    pub const fn new(per_second: u32) -> Limiter {
        Limiter { per_second, window_start: None, in_window: 0, suppressed: 0 }
    }

    pub fn warn(&mut self, now: Instant, event: &str, message: fmt::Arguments<'_>) {
        if !enabled(Level::Warn) {
            return;
        }
        if self.window_start.is_none_or(|start| now.duration_since(start) >= Duration::from_secs(1)) {
            if self.suppressed > 0 {
                let held = self.suppressed;
                warn(
                    "client_warnings_held_back",
                    format_args!("{held} more client warnings in the last second were not logged"),
                );
            }
            self.window_start = Some(now);
            self.in_window = 0;
            self.suppressed = 0;
        }
        if self.in_window < self.per_second {
            self.in_window += 1;
            warn(event, message);
        } else {
            self.suppressed += 1;
        }
    }
}

/// Logs how far a long start-up step has got, at most once a second:
/// percent done and rate.
pub struct Progress {
    /// None: counts, says nothing (`quiet`).
    what: Option<&'static str>,
    total_bytes: u64,
    done_bytes: u64,
    calls: u64,
    started: Instant,
    next_report: Instant,
}

impl Progress {
    pub fn new(what: &'static str, total_bytes: u64) -> Progress {
        let now = Instant::now();
        let what = Some(what);
        Progress { what, total_bytes, done_bytes: 0, calls: 0, started: now, next_report: now + Duration::from_secs(1) }
    }

    /// A progress that logs nothing (a step that is not part of the start).
    pub fn quiet() -> Progress {
        let mut progress = Progress::new("", 0);
        progress.what = None;
        progress
    }

    pub fn advance(&mut self, bytes: u64) {
        self.done_bytes += bytes;
        self.calls += 1;
        let Some(what) = self.what else { return };
        // Small steps: look at the clock every 1024 of them, not each time.
        if bytes < 65536 && !self.calls.is_multiple_of(1024) {
            return;
        }
        let now = Instant::now();
        if now < self.next_report {
            return;
        }
        self.next_report = now + Duration::from_secs(1);
        let seconds = now.duration_since(self.started).as_secs_f64();
        info(
            "recovery_progress",
            format_args!(
                "recovery: {} {:.0}% ({} of {} MB, {:.0} MB/s)",
                what,
                self.done_bytes as f64 * 100.0 / self.total_bytes.max(1) as f64,
                self.done_bytes >> 20,
                self.total_bytes >> 20,
                (self.done_bytes >> 20) as f64 / seconds
            ),
        );
    }
}

/// Warnings about clients (limits hit, connections closed for abuse): at
/// most 20 a second, so a flood of bad clients cannot flood the log.
pub fn client_warning(event: &str, now: Instant, message: fmt::Arguments<'_>) {
    static CLIENTS: Mutex<Limiter> = Mutex::new(Limiter::new(20));
    if let Ok(mut limiter) = CLIENTS.lock() {
        limiter.warn(now, event, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_one_object_with_escaped_text() {
        let mut line = Vec::new();
        let time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_813_200_123);
        let path = "/srv/\"q\"";
        json_line(
            &mut line,
            (time, Level::Warn, "listening"),
            &[("data_dir", &path), ("port", &8080)],
            format_args!("a\nb"),
        );
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "{\"time\":\"2026-11-27T21:00:00.123Z\",\"level\":\"warn\",\"event\":\"listening\",\"message\":\"a\\nb\",\
             \"data_dir\":\"/srv/\\\"q\\\"\",\"port\":\"8080\"}\n"
        );
    }
}

//! Operator logs: one line each on standard error, at a level `--log-level`
//! chooses, and warnings about clients rate-limited so that abuse cannot
//! flood the log.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn write(level: Level, message: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let tag = match level {
        Level::Error => "error: ",
        Level::Warn => "warning: ",
        Level::Info => "",
        Level::Debug => "debug: ",
    };
    let _ = writeln!(io::stderr().lock(), "quiver: {tag}{message}");
}

pub fn info(message: fmt::Arguments<'_>) {
    write(Level::Info, message);
}

/// What an operator looks at to follow the traffic: each request, each
/// commit of the log. Callers ask `enabled(Level::Debug)` first where
/// gathering the fields costs anything.
pub fn debug(message: fmt::Arguments<'_>) {
    write(Level::Debug, message);
}

/// The start-up banner (address, data directory, API key): printed at every
/// level, because operators need the key and the contract promises it.
pub fn banner(message: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "quiver: {message}");
}

pub fn warn(message: fmt::Arguments<'_>) {
    write(Level::Warn, message);
}

pub fn error(message: fmt::Arguments<'_>) {
    write(Level::Error, message);
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

    pub fn warn(&mut self, now: Instant, message: fmt::Arguments<'_>) {
        if !enabled(Level::Warn) {
            return;
        }
        if self.window_start.is_none_or(|start| now.duration_since(start) >= Duration::from_secs(1)) {
            if self.suppressed > 0 {
                warn(format_args!("{} more client warnings in the last second were not logged", self.suppressed));
            }
            self.window_start = Some(now);
            self.in_window = 0;
            self.suppressed = 0;
        }
        if self.in_window < self.per_second {
            self.in_window += 1;
            warn(message);
        } else {
            self.suppressed += 1;
        }
    }
}

/// Logs how far a long start-up step has got, at most once a second:
/// percent done and rate.
pub struct Progress {
    what: &'static str,
    total_bytes: u64,
    done_bytes: u64,
    calls: u64,
    started: Instant,
    next_report: Instant,
}

impl Progress {
    pub fn new(what: &'static str, total_bytes: u64) -> Progress {
        let now = Instant::now();
        Progress { what, total_bytes, done_bytes: 0, calls: 0, started: now, next_report: now + Duration::from_secs(1) }
    }

    pub fn advance(&mut self, bytes: u64) {
        self.done_bytes += bytes;
        self.calls += 1;
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
        info(format_args!(
            "recovery: {} {:.0}% ({} of {} MB, {:.0} MB/s)",
            self.what,
            self.done_bytes as f64 * 100.0 / self.total_bytes.max(1) as f64,
            self.done_bytes >> 20,
            self.total_bytes >> 20,
            (self.done_bytes >> 20) as f64 / seconds
        ));
    }
}

/// Warnings about clients (limits hit, connections closed for abuse): at
/// most 20 a second, so a flood of bad clients cannot flood the log.
pub fn client_warning(now: Instant, message: fmt::Arguments<'_>) {
    static CLIENTS: Mutex<Limiter> = Mutex::new(Limiter::new(20));
    if let Ok(mut limiter) = CLIENTS.lock() {
        limiter.warn(now, message);
    }
}

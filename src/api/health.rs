//! GET /api/v1/health: the process's CPU and memory use, and its uptime.

use std::time::{Duration, Instant};

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use super::envelope::Envelope;
use super::json;
use crate::limits::HEALTH_SAMPLE_INTERVAL_MS;

/// Samples the figures at most once per interval, so a health probe costs
/// a formatted reply and nothing more.
pub struct Health {
    /// `None` when the platform's figures cannot be read at all.
    system: Option<System>,
    pid: Option<Pid>,
    started: Instant,
    sampled: Option<Instant>,
    figures: Result<(f64, f64), &'static str>,
}

impl Health {
    pub fn new() -> Health {
        let system = System::new().ok().map(|mut system| {
            system.refresh_memory();
            system
        });
        Health {
            system,
            pid: sysinfo::get_current_pid().ok(),
            started: Instant::now(),
            sampled: None,
            figures: Err("not sampled yet"),
        }
    }

    fn sample(&mut self, now: Instant) -> Result<(f64, f64), &'static str> {
        let interval = Duration::from_millis(HEALTH_SAMPLE_INTERVAL_MS);
        if self.sampled.is_some_and(|at| now.duration_since(at) < interval) {
            return self.figures;
        }
        self.sampled = Some(now);
        self.figures = (|| {
            let system = self.system.as_mut().ok_or("cannot read this system's figures")?;
            let pid = self.pid.ok_or("cannot determine the server's process id")?;
            let refresh = ProcessRefreshKind::nothing().with_cpu().with_memory();
            system.refresh_processes_specifics(ProcessesToUpdate::Some(&[pid]), false, refresh);
            let process = system.process(pid).ok_or("cannot read the server's process figures")?;
            let total = system.total_memory();
            if total == 0 {
                return Err("cannot read the machine's memory size");
            }
            let cpu = f64::from(process.cpu_usage());
            let memory = process.memory() as f64 * 100.0 / total as f64;
            Ok((cpu, memory))
        })();
        self.figures
    }

    /// Writes the health answer; returns its status.
    pub fn write(&mut self, out: &mut Vec<u8>, keep_alive: bool) -> u16 {
        let now = Instant::now();
        match self.sample(now) {
            Ok((cpu, memory)) => {
                let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("healthy"));
                let out = envelope.data();
                out.extend_from_slice(b"{\"cpu_usage_percent\":");
                json::write_f64(out, cpu);
                out.extend_from_slice(b",\"mem_usage_percent\":");
                json::write_f64(out, memory);
                out.extend_from_slice(b",\"uptime\":\"");
                write_go_duration(out, now.duration_since(self.started));
                out.extend_from_slice(b"\"}");
                envelope.finish()
            }
            Err(why) => Envelope::start(out, 500, keep_alive, format_args!("unhealthy"))
                .simple_error("ERROR_GETTING_CPU_USAGE", format_args!("{why}")),
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

/// Writes a duration as Go's `time.Duration.String` does: `72h3m0.5s`,
/// `1m2.25s`, `850ms`, `1.5µs`, `0s`.
pub fn write_go_duration(out: &mut Vec<u8>, duration: Duration) {
    let nanos = duration.as_nanos().min(u128::from(u64::MAX)) as u64;
    if nanos == 0 {
        out.extend_from_slice(b"0s");
        return;
    }
    if nanos < 1_000_000_000 {
        let (unit, scale): (&str, u64) = match nanos {
            0..1_000 => ("ns", 1),
            1_000..1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        write_fraction(out, nanos / scale, nanos % scale, scale);
        out.extend_from_slice(unit.as_bytes());
        return;
    }
    let total_seconds = nanos / 1_000_000_000;
    let (hours, minutes, seconds) = (total_seconds / 3600, total_seconds / 60 % 60, total_seconds % 60);
    if hours > 0 {
        json::write_u64(out, hours);
        out.push(b'h');
    }
    if hours > 0 || minutes > 0 {
        json::write_u64(out, minutes);
        out.push(b'm');
    }
    write_fraction(out, seconds, nanos % 1_000_000_000, 1_000_000_000);
    out.push(b's');
}

/// Writes `whole.fraction` where `fraction < scale` (a power of ten), without trailing zeros.
fn write_fraction(out: &mut Vec<u8>, whole: u64, fraction: u64, scale: u64) {
    json::write_u64(out, whole);
    if fraction == 0 {
        return;
    }
    out.push(b'.');
    let mut digit_scale = scale / 10;
    let mut rest = fraction;
    while rest > 0 {
        out.push(b'0' + (rest / digit_scale) as u8);
        rest %= digit_scale;
        digit_scale /= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(nanos: u64) -> String {
        let mut out = Vec::new();
        write_go_duration(&mut out, Duration::from_nanos(nanos));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(go(0), "0s");
        assert_eq!(go(999), "999ns");
        assert_eq!(go(1_500), "1.5µs");
        assert_eq!(go(850_000_000), "850ms");
        assert_eq!(go(1_000_000_000), "1s");
        assert_eq!(go(62_250_000_000), "1m2.25s");
        assert_eq!(go((72 * 3600 + 3 * 60) * 1_000_000_000 + 500_000_000), "72h3m0.5s");
        assert_eq!(go(3600 * 1_000_000_000), "1h0m0s");
        assert_eq!(go(1_000_000_001), "1.000000001s");
    }

    #[test]
    fn reports_figures() {
        let mut health = Health::new();
        let mut out = Vec::new();
        health.write(&mut out, true);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\"message\":\"healthy\""), "{text}");
        assert!(text.contains("\"uptime\":\""), "{text}");
    }
}

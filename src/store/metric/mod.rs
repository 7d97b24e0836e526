//! How nearness is measured: the nine metrics, their names on the wire and
//! their codes on disk.

/// How nearness is measured: EigenDB's nine metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Cosine similarity, larger is nearer.
    Cosine,
    /// Squared Euclidean distance, smaller is nearer.
    L2,
    /// Inner product, larger is nearer.
    Ip,
    /// Σ|x−q| (Manhattan).
    L1,
    /// max|x−q| (Chebyshev).
    Linf,
    /// (Σ|x−q|^p)^(1/p) (Minkowski).
    Lp(Power),
    /// Σ|x−q| / (|x|+|q|), a 0/0 term counting 0.
    Canberra,
    /// Σ|x−q| / Σ|x+q| (Bray-Curtis).
    BrayCurtis,
    /// Jensen-Shannon divergence, of vectors without negative values.
    JensenShannon,
}

/// The `p` of an `lp` index: a positive, finite f32 (rounded once from the
/// number a client gave, as vector values are).
#[derive(Clone, Copy, Debug)]
pub struct Power(f32);

impl Power {
    /// `p`, if it is positive and finite once rounded to f32.
    pub fn new(p: f64) -> Option<Power> {
        let p = p as f32;
        (p > 0.0 && p.is_finite()).then_some(Power(p))
    }

    pub fn get(self) -> f32 {
        self.0
    }
}

/// Bit for bit: every `Power` is a positive finite f32, so no NaN to mind.
impl PartialEq for Power {
    fn eq(&self, other: &Power) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Power {}

impl Metric {
    pub const ALLOWED: &'static str = "cosine, l2, ip, l1, linf, lp, canberra, bc, js";

    /// The metric named `name`; `lp` takes its `p` (`None` when it has
    /// none or one out of range, which `LpNeedsP` reports).
    pub fn parse(name: &str, p: Option<f64>) -> Result<Metric, MetricError> {
        Ok(match name {
            "cosine" => Metric::Cosine,
            "l2" => Metric::L2,
            "ip" => Metric::Ip,
            "l1" => Metric::L1,
            "linf" => Metric::Linf,
            "lp" => Metric::Lp(p.and_then(Power::new).ok_or(MetricError::LpNeedsP)?),
            "canberra" => Metric::Canberra,
            "bc" => Metric::BrayCurtis,
            "js" => Metric::JensenShannon,
            _ => return Err(MetricError::Unknown),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
            Metric::Ip => "ip",
            Metric::L1 => "l1",
            Metric::Linf => "linf",
            Metric::Lp(_) => "lp",
            Metric::Canberra => "canberra",
            Metric::BrayCurtis => "bc",
            Metric::JensenShannon => "js",
        }
    }

    /// `lp`'s `p`.
    pub fn power(self) -> Option<f32> {
        match self {
            Metric::Lp(p) => Some(p.get()),
            _ => None,
        }
    }

    /// Whether a larger score is nearer (cosine, ip); every other metric
    /// is a distance.
    pub fn is_similarity(self) -> bool {
        matches!(self, Metric::Cosine | Metric::Ip)
    }

    /// Its code in the log and in snapshots: fixed for good, since files
    /// written by every earlier version must still read. `lp` writes its
    /// `p` (`power`) beside it.
    pub fn code(self) -> u8 {
        match self {
            Metric::Cosine => 0,
            Metric::L2 => 1,
            Metric::Ip => 2,
            Metric::L1 => 3,
            Metric::Linf => 4,
            Metric::Lp(_) => LP_CODE,
            Metric::Canberra => 6,
            Metric::BrayCurtis => 7,
            Metric::JensenShannon => 8,
        }
    }

    /// Whether the metric of `code` has a `p` written beside it.
    pub fn code_has_power(code: u8) -> bool {
        code == LP_CODE
    }

    /// The metric of a code read from a file (`code`), with the `p` read
    /// beside it if `code_has_power`; `None` if they make no metric.
    pub fn from_code(code: u8, p: f32) -> Option<Metric> {
        Some(match code {
            0 => Metric::Cosine,
            1 => Metric::L2,
            2 => Metric::Ip,
            3 => Metric::L1,
            4 => Metric::Linf,
            LP_CODE => Metric::Lp(Power::new(f64::from(p))?),
            6 => Metric::Canberra,
            7 => Metric::BrayCurtis,
            8 => Metric::JensenShannon,
            _ => return None,
        })
    }
}

/// `lp`'s code in files: the one metric with a `p` beside it.
const LP_CODE: u8 = 5;

/// Why `Metric::parse` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricError {
    /// Not one of `Metric::ALLOWED`.
    Unknown,
    /// `lp` without a `p` that is a number above 0 and finite.
    LpNeedsP,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_codes_are_as_written_on_disk() {
        let lp = Metric::Lp(Power::new(3.5).unwrap());
        let metrics = [Metric::Cosine, Metric::L2, Metric::Ip, Metric::L1, Metric::Linf, lp];
        let metrics = metrics.into_iter().chain([Metric::Canberra, Metric::BrayCurtis, Metric::JensenShannon]);
        for (code, metric) in metrics.enumerate() {
            assert_eq!(metric.code(), code as u8);
            assert_eq!(Metric::code_has_power(code as u8), metric.power().is_some());
            assert_eq!(Metric::from_code(code as u8, metric.power().unwrap_or(0.0)), Some(metric));
            assert_eq!(Metric::parse(metric.name(), Some(3.5)), Ok(metric));
        }
        assert_eq!(Metric::from_code(9, 0.0), None);
        assert_eq!(Metric::from_code(5, 0.0), None, "lp without a p");
        for p in [None, Some(0.0), Some(-1.0), Some(f64::INFINITY), Some(f64::NAN), Some(1e-50), Some(1e39)] {
            assert_eq!(Metric::parse("lp", p), Err(MetricError::LpNeedsP), "p = {p:?}");
        }
        assert_eq!(Metric::parse("lp", Some(0.1)), Ok(Metric::Lp(Power(0.1))));
        assert_eq!(Metric::parse("hamming", Some(1.0)), Err(MetricError::Unknown));
    }
}

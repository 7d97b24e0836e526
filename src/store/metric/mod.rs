//! How nearness is measured: the nine metrics, one file each.
//!
//! A metric's file holds all that is its own: its name on the wire and its
//! code on disk, what it refuses in a vector, how a query is prepared and a
//! score reported, its exact kernel (for the distances beyond cosine, ip and
//! l2, the kernel itself, with the proof of its range), and which first
//! pass bounds it (`codes` for products, `codes::floors` for coordinate
//! distances). Each is a `Kind`, a type of its own, so that the scans
//! are compiled once per metric with its constants folded in.
//!
//! This file registers them: the [`Metric`] enum a client's index is
//! created with, and `with_kind!`, the one place an enum value becomes its
//! `Kind`. Adding a tenth metric is a file beside these, and here its
//! `mod` line, its variant, its arm of `with_kind!` and its entry in
//! `Metric::EVERY` (without which `parse` would not find it).

mod bray_curtis;
mod canberra;
mod cosine;
mod ip;
mod jensen_shannon;
mod l1;
mod l2;
mod linf;
mod lp;

use std::fmt;

pub use lp::Power;

use super::codes::Bound;
use super::kernels::{self, Measure};
use crate::limits::SQUARED_NORM_MAX;

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

/// The one dispatch from a `Metric` to its `Kind`: runs `$body` with
/// `$kind` bound to the metric's kind value and `$K` to its type, compiled
/// once per kind.
macro_rules! with_kind {
    ($metric:expr, $kind:ident: $K:ident => $body:expr) => {
        match $metric {
            Metric::Cosine => {
                type $K = cosine::Cosine;
                let $kind: $K = cosine::Cosine;
                $body
            }
            Metric::L2 => {
                type $K = l2::L2;
                let $kind: $K = l2::L2;
                $body
            }
            Metric::Ip => {
                type $K = ip::Ip;
                let $kind: $K = ip::Ip;
                $body
            }
            Metric::L1 => {
                type $K = l1::L1;
                let $kind: $K = l1::L1;
                $body
            }
            Metric::Linf => {
                type $K = linf::Linf;
                let $kind: $K = linf::Linf;
                $body
            }
            Metric::Lp(p) => {
                type $K = lp::Lp;
                let $kind: $K = lp::Lp(p);
                $body
            }
            Metric::Canberra => {
                type $K = canberra::Canberra;
                let $kind: $K = canberra::Canberra;
                $body
            }
            Metric::BrayCurtis => {
                type $K = bray_curtis::BrayCurtis;
                let $kind: $K = bray_curtis::BrayCurtis;
                $body
            }
            Metric::JensenShannon => {
                type $K = jensen_shannon::JensenShannon;
                let $kind: $K = jensen_shannon::JensenShannon;
                $body
            }
        }
    };
}

/// One metric, as its file defines it. The constants are what the scans
/// and the index ask of a metric; the defaults are a distance's (smaller
/// is nearer, any finite value, no scales).
trait Kind: Copy {
    /// Its name on the wire.
    const NAME: &'static str;
    /// Its code in the log and in snapshots: fixed for good, since files
    /// written by every earlier version must still read.
    const CODE: u8;
    /// Whether a larger score is nearer (its distance is the score negated).
    const SIMILARITY: bool = false;
    /// Whether it refuses values below zero.
    const NON_NEGATIVE: bool = false;
    /// Whether a product is scaled by the row's and the query's inverse
    /// norms (cosine): the index keeps each row's, a search each query's.
    const SCALED: bool = false;

    /// Refuses a vector by its `squared` norm, beyond the limit every
    /// metric has (`SQUARED_NORM_MAX`).
    fn check_norm(_squared: f64) -> Result<(), VectorError> {
        Ok(())
    }

    /// The value a hit reports, from its `distance` and the power of two
    /// its query was divided by (`Index::prepare_query`).
    fn score(distance: f32, _divisor: f64) -> f32 {
        distance
    }

    /// The first pass that bounds its scores from int8 codes, if one is
    /// proved for it.
    fn first_pass(self) -> Option<Bound>;

    /// The distance of one (query, row) pair, bit for bit as its scan finds
    /// it (smaller is nearer).
    fn distance(self, query: &[f32], row: &[f32]) -> f32;

    /// Scores a tile of the exact scan; a pair at a time by `distance`
    /// unless a tiled kernel serves the metric.
    #[inline(always)]
    fn scan_tile<T: ExactTile>(self, tile: T) {
        tile.pairs(|query, row| self.distance(query, row));
    }
}

/// A tile of the exact scan (`scan::exact`) as a metric scores it: queries
/// against rows, each pair offered to its query's top.
pub(in crate::store) trait ExactTile {
    /// Scores every pair with the tiled kernel `M`, each score made a
    /// distance by `distance(score, row_scale, query_scale)`; the scales
    /// are the inverse norms where `SCALED`, else 1.
    fn products<M: Measure, const SCALED: bool>(self, distance: impl Fn(f32, f32, f32) -> f32);

    /// Scores each pair by `distance(query, row)`.
    fn pairs(self, distance: impl Fn(&[f32], &[f32]) -> f32);
}

impl Metric {
    pub const ALLOWED: &'static str = "cosine, l2, ip, l1, linf, lp, canberra, bc, js";

    /// Each metric once (lp with some `p`): what `parse` and `from_code`
    /// look through.
    const EVERY: [Metric; 9] = [
        Metric::Cosine,
        Metric::L2,
        Metric::Ip,
        Metric::L1,
        Metric::Linf,
        Metric::Lp(Power::ONE),
        Metric::Canberra,
        Metric::BrayCurtis,
        Metric::JensenShannon,
    ];

    /// The metric named `name`; `lp` takes its `p` (`None` when it has
    /// none or one out of range, which `LpNeedsP` reports).
    pub fn parse(name: &str, p: Option<f64>) -> Result<Metric, MetricError> {
        let metric = Metric::EVERY.into_iter().find(|metric| metric.name() == name).ok_or(MetricError::Unknown)?;
        metric.with_power(p.and_then(Power::new))
    }

    /// This metric with `power` as its `p`, if it takes one.
    fn with_power(self, power: Option<Power>) -> Result<Metric, MetricError> {
        match self {
            Metric::Lp(_) => power.map(Metric::Lp).ok_or(MetricError::LpNeedsP),
            metric => Ok(metric),
        }
    }

    pub fn name(self) -> &'static str {
        with_kind!(self, _kind: K => K::NAME)
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
        with_kind!(self, _kind: K => K::SIMILARITY)
    }

    /// Whether rows and queries are scaled by their inverse norms (cosine):
    /// the index keeps each row's.
    pub fn is_scaled(self) -> bool {
        with_kind!(self, _kind: K => K::SCALED)
    }

    /// Its code in the log and in snapshots: fixed for good, since files
    /// written by every earlier version must still read. `lp` writes its
    /// `p` (`power`) beside it.
    pub fn code(self) -> u8 {
        with_kind!(self, _kind: K => K::CODE)
    }

    /// Whether the metric of `code` has a `p` written beside it.
    pub fn code_has_power(code: u8) -> bool {
        Metric::EVERY.iter().any(|metric| metric.code() == code && metric.power().is_some())
    }

    /// The metric of a code read from a file (`code`), with the `p` read
    /// beside it if `code_has_power`; `None` if they make no metric.
    pub fn from_code(code: u8, p: f32) -> Option<Metric> {
        let metric = Metric::EVERY.into_iter().find(|metric| metric.code() == code)?;
        metric.with_power(Power::new(f64::from(p))).ok()
    }

    /// Checks a vector's values and norm: finite, none below zero where
    /// the metric refuses them, a norm inside the numeric domain (`limits`)
    /// and (cosine) a direction. Gives its `kernels::squared_norm`.
    pub fn check(self, vector: &[f32]) -> Result<f64, VectorError> {
        with_kind!(self, _kind: K => check::<K>(vector))
    }

    /// The scale of a query in its distances, from its squared norm (asked
    /// for only where needed): 1/|q| for cosine, else 1.
    pub(in crate::store) fn query_scale(self, squared_norm: impl FnOnce() -> f64) -> f32 {
        if self.is_scaled() {
            kernels::inverse_norm_of(squared_norm())
        } else {
            1.0
        }
    }

    /// The value a hit is reported with (`Kind::score`).
    pub fn score(self, distance: f32, divisor: f64) -> f32 {
        with_kind!(self, _kind: K => K::score(distance, divisor))
    }

    /// The int8 first pass of its searches, if one is proved for it.
    pub(in crate::store) fn first_pass(self) -> Option<Bound> {
        with_kind!(self, kind: K => kind.first_pass())
    }

    /// The distance of `query` to `row`, as a search ranks by it (smaller
    /// is nearer): the same bits as the scan's.
    pub fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        with_kind!(self, kind: K => kind.distance(query, row))
    }

    /// Scores a tile of the exact scan with this metric's kernel.
    #[inline(always)]
    pub(in crate::store) fn scan_tile(self, tile: impl ExactTile) {
        with_kind!(self, kind: K => kind.scan_tile(tile))
    }
}

/// `Metric::check` for the kind `K`.
fn check<K: Kind>(vector: &[f32]) -> Result<f64, VectorError> {
    // One pass for both: finite, and not below zero where refused.
    let refused = |x: f32| !x.is_finite() || (K::NON_NEGATIVE && x < 0.0);
    // Without an early exit the check runs in vector registers; a refused
    // value is then looked for again.
    if vector.iter().fold(false, |any, &x| any | refused(x)) {
        let position = vector.iter().position(|&x| refused(x)).expect("a refused value");
        return Err(if vector[position].is_finite() {
            VectorError::Negative { position }
        } else {
            VectorError::NotFinite { position }
        });
    }
    // Zero only for the zero vector: the square of any other f32 is a
    // normal f64.
    let squared = kernels::squared_norm(vector);
    if squared > SQUARED_NORM_MAX {
        return Err(VectorError::NormTooLarge);
    }
    K::check_norm(squared)?;
    Ok(squared)
}

/// Why `Metric::parse` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricError {
    /// Not one of `Metric::ALLOWED`.
    Unknown,
    /// `lp` without a `p` that is a number above 0 and finite.
    LpNeedsP,
}

/// Why one vector cannot be stored in (or searched against) an index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorError {
    WrongDimensions {
        expected: usize,
        got: usize,
    },
    NotFinite {
        position: usize,
    },
    ZeroForCosine,
    /// js only: a value below zero, which has no logarithm.
    Negative {
        position: usize,
    },
    /// Euclidean norm above 2^62 (`limits::SQUARED_NORM_MAX`).
    NormTooLarge,
    /// Cosine only: a Euclidean norm below 2^-62 (`limits::COSINE_SQUARED_NORM_MIN`).
    NormTooSmall,
}

impl fmt::Display for VectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VectorError::WrongDimensions { expected, got } => {
                write!(f, "expected {expected} dimensions, got {got}")
            }
            VectorError::NotFinite { position } => {
                write!(f, "value at position {position} is not a finite 32-bit float")
            }
            VectorError::ZeroForCosine => {
                write!(f, "an all-zero vector has no direction in a cosine index")
            }
            VectorError::Negative { position } => {
                write!(f, "value at position {position} is negative, and a js index scores only vectors without negative values")
            }
            VectorError::NormTooLarge => {
                write!(f, "its Euclidean norm is above 2^62 (about 4.6e18), the largest that is scored exactly")
            }
            VectorError::NormTooSmall => write!(
                f,
                "its Euclidean norm is below 2^-62 (about 2.2e-19), the smallest a cosine index scores exactly"
            ),
        }
    }
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
        assert_eq!(Metric::parse("lp", Some(0.1)), Ok(Metric::Lp(Power::new(0.1).unwrap())));
        assert_eq!(Metric::parse("hamming", Some(1.0)), Err(MetricError::Unknown));
    }

    /// `EVERY` holds each metric once, with the codes 0 to 8, and `ALLOWED`
    /// names them in its order.
    #[test]
    fn every_metric_is_registered_once() {
        let names: Vec<&str> = Metric::EVERY.iter().map(|metric| metric.name()).collect();
        assert_eq!(names.join(", "), Metric::ALLOWED);
        let codes: Vec<u8> = Metric::EVERY.iter().map(|metric| metric.code()).collect();
        assert_eq!(codes, (0..Metric::EVERY.len() as u8).collect::<Vec<_>>());
    }
}

//! The inner product, larger is nearer: ranked by its negation.
//!
//! A query is scaled to a norm in [1, 2) before its scan
//! (`Index::prepare_query`), and its scores scaled back when reported.

use super::{ExactTile, Kind};
use crate::store::codes::{Bound, Shape};
use crate::store::kernels::{self, Dot};

#[derive(Clone, Copy)]
pub(super) struct Ip;

impl Kind for Ip {
    const NAME: &'static str = "ip";
    const CODE: u8 = 2;
    const SIMILARITY: bool = true;

    /// The product with the query as it was given: scaled back by the power
    /// of two it was divided by, exact unless it leaves f32's normal range,
    /// where it rounds once.
    fn score(distance: f32, divisor: f64) -> f32 {
        (-f64::from(distance) * divisor) as f32
    }

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Products(Shape::Ip))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        -kernels::dot(query, row)
    }

    #[inline(always)]
    fn scan_tile<T: ExactTile>(self, tile: T) {
        tile.products::<Dot, false>(|score, _, _| -score);
    }
}

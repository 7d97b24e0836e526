//! Cosine similarity: the inner product of the two vectors divided by both
//! norms, larger is nearer.
//!
//! The stored vector stays exactly as given: the index keeps each row's
//! 1/|x| beside it, and a search scales by its query's 1/|q| (`SCALED`),
//! each product being `-((s x 1/|x|) x 1/|q|)` (`screen::distance`). A
//! vector without a direction (zero) is refused, and one whose norm is below
//! 2^-62, whose inverse would leave the numeric domain (`limits`).

use super::{ExactTile, Kind, VectorError};
use crate::limits::COSINE_SQUARED_NORM_MIN;
use crate::store::codes::{Bound, Shape};
use crate::store::kernels::{self, Dot};
use crate::store::screen;

#[derive(Clone, Copy)]
pub(super) struct Cosine;

impl Kind for Cosine {
    const NAME: &'static str = "cosine";
    const CODE: u8 = 0;
    const SIMILARITY: bool = true;
    const SCALED: bool = true;

    fn check_norm(squared: f64) -> Result<(), VectorError> {
        if squared == 0.0 {
            return Err(VectorError::ZeroForCosine);
        }
        if squared < COSINE_SQUARED_NORM_MIN {
            return Err(VectorError::NormTooSmall);
        }
        Ok(())
    }

    /// The similarity: the distance negated (the query's scale is divided
    /// back out by its norm, so `divisor` changes nothing).
    fn score(distance: f32, _divisor: f64) -> f32 {
        -distance
    }

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Products(Shape::Cosine))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        screen::distance(kernels::dot(query, row), kernels::inverse_norm(row), kernels::inverse_norm(query))
    }

    #[inline(always)]
    fn scan_tile<T: ExactTile>(self, tile: T) {
        tile.products::<Dot, true>(screen::distance);
    }
}

//! Squared Euclidean distance, Σ(x−q)², smaller is nearer (reported
//! squared, as EigenDB does).

use super::{ExactTile, Kind};
use crate::store::codes::{Bound, Shape};
use crate::store::kernels::{self, L2Squared};

#[derive(Clone, Copy)]
pub(super) struct L2;

impl Kind for L2 {
    const NAME: &'static str = "l2";
    const CODE: u8 = 1;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Products(Shape::L2))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        kernels::l2_squared(query, row)
    }

    #[inline(always)]
    fn scan_tile<T: ExactTile>(self, tile: T) {
        tile.products::<L2Squared, false>(|score, _, _| score);
    }
}

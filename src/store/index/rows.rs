//! The id -> row map of an index. The table holds only row numbers (4
//! bytes a slot); a slot's id is read from the index's `ids`, which the
//! caller passes to every call. A map of `i64 -> u32` pairs would take 16
//! bytes a slot, 12 of them repeating what `ids` already holds: at a
//! million rows of 128 dimensions that is 24 MiB, a tenth of the f32 rows.

use ahash::RandomState;
use hashbrown::HashTable;

/// Row numbers by the id in `ids[row]`.
pub(super) struct RowMap {
    table: HashTable<u32>,
    hasher: RandomState,
}

impl RowMap {
    pub fn new() -> RowMap {
        RowMap { table: HashTable::new(), hasher: RandomState::new() }
    }

    /// The map of every row of `ids`, or the first id that appears twice.
    pub fn of(ids: &[i64]) -> Result<RowMap, i64> {
        let mut map = RowMap { table: HashTable::with_capacity(ids.len()), hasher: RandomState::new() };
        for (row, &id) in ids.iter().enumerate() {
            if map.get(ids, id).is_some() {
                return Err(id);
            }
            map.insert(ids, row as u32);
        }
        Ok(map)
    }

    fn hash(&self, id: i64) -> u64 {
        self.hasher.hash_one(id)
    }

    /// The row holding `id`.
    pub fn get(&self, ids: &[i64], id: i64) -> Option<u32> {
        self.table.find(self.hash(id), |&row| ids[row as usize] == id).copied()
    }

    /// Maps `ids[row]` to `row`; its id must not be in the map yet.
    pub fn insert(&mut self, ids: &[i64], row: u32) {
        let hash = self.hash(ids[row as usize]);
        let hasher = &self.hasher;
        self.table.insert_unique(hash, row, |&row| hasher.hash_one(ids[row as usize]));
    }

    /// Takes `id` out of the map, giving the row it was in.
    pub fn remove(&mut self, ids: &[i64], id: i64) -> Option<u32> {
        let entry = self.table.find_entry(self.hash(id), |&row| ids[row as usize] == id).ok()?;
        Some(entry.remove().0)
    }

    /// `id`, which was in row `from`, is now in row `to`.
    pub fn moved(&mut self, id: i64, from: u32, to: u32) {
        let slot = self.table.find_mut(self.hash(id), |&row| row == from).expect("a moved id is in the map");
        *slot = to;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_inserts_removals_and_moves() {
        let mut ids: Vec<i64> = Vec::new();
        let mut map = RowMap::new();
        for id in (0..2000).map(|n| n * 7919 - 5000) {
            ids.push(id);
            map.insert(&ids, ids.len() as u32 - 1);
        }
        // Remove as an index does: the last row moves into the hole.
        for id in (0..2000).step_by(3).map(|n| n * 7919 - 5000) {
            let row = map.remove(&ids, id).unwrap();
            let last = ids.len() as u32 - 1;
            if row != last {
                map.moved(ids[last as usize], last, row);
            }
            ids.swap_remove(row as usize);
            assert_eq!(map.get(&ids, id), None);
        }
        for (row, &id) in ids.iter().enumerate() {
            assert_eq!(map.get(&ids, id), Some(row as u32));
        }
        assert_eq!(map.remove(&ids, 1), None);
        assert_eq!(RowMap::of(&ids).map(|map| map.get(&ids, ids[5])), Ok(Some(5)));
        assert_eq!(RowMap::of(&[4, -1, 4]).err(), Some(4));
    }
}

use super::*;

fn entry(index: u64, term: u64, data: &str) -> Entry {
    Entry { index, term, data: data.as_bytes().to_vec().into(), ..Entry::default() }
}

fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    range.map(|index| entry(index, term, &format!("{index}@{term}"))).collect()
}

/// A log in `dir` with `runs` of entries (each a range of indexes and
/// their term) appended and synced.
fn synced(dir: &Path, runs: &[(std::ops::RangeInclusive<u64>, u64)]) -> LogStore {
    let mut store = LogStore::open(dir, None).unwrap();
    for (range, term) in runs {
        store.append(&entries(range.clone(), *term));
    }
    store.sync().unwrap();
    store
}

fn voters(ids: &[u64]) -> ConfState {
    ConfState { voters: ids.to_vec(), ..ConfState::default() }
}

/// Everything `raft` can read of a log: its state, its bounds, its entries
/// (index, term, data).
type ReadBack = ((HardState, ConfState), u64, u64, Vec<(u64, u64, Vec<u8>)>);

fn read_back(store: &LogStore) -> ReadBack {
    let RaftState { hard_state, conf_state } = store.initial_state().unwrap();
    let state = (hard_state, conf_state);
    let (first, last) = (store.first_index().unwrap(), Storage::last_index(store).unwrap());
    let found = store.entries(first, last + 1, None, GetEntriesContext::empty(false)).unwrap();
    for entry in &found {
        assert_eq!(store.term(entry.index).unwrap(), entry.term);
    }
    (state, first, last, found.into_iter().map(|e| (e.index, e.term, e.data.to_vec())).collect())
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState { term, vote, commit, ..HardState::default() }
}

#[test]
fn what_was_synced_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), None).unwrap();
    assert_eq!((store.first_index().unwrap(), Storage::last_index(&store).unwrap()), (1, 0));
    store.restart_after(&Point { index: 0, term: 0, conf_state: voters(&[1, 2, 3]) }).unwrap();
    store.append(&entries(1..=5, 1));
    store.set_hard_state(&hard_state(1, 2, 3));
    store.sync().unwrap();
    let before = read_back(&store);
    assert_eq!((before.1, before.2), (1, 5));
    drop(store);
    let store = LogStore::open(dir.path(), None).unwrap();
    assert_eq!(read_back(&store), before);
    assert_eq!(store.initial_state().unwrap().hard_state, hard_state(1, 2, 3));
    assert_eq!(store.initial_state().unwrap().conf_state, voters(&[1, 2, 3]));
}

#[test]
fn appends_not_synced_are_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = synced(dir.path(), &[(1..=2, 1)]);
    store.append(&entries(3..=4, 1));
    store.set_hard_state(&hard_state(1, 1, 4));
    drop(store);
    let store = LogStore::open(dir.path(), None).unwrap();
    assert_eq!(read_back(&store).2, 2);
    assert_eq!(store.hard_state().commit, 0);
}

#[test]
fn an_overwritten_suffix_stays_dropped_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = synced(dir.path(), &[(1..=5, 1)]);
    // A new leader's entries from 3 on replace the old ones.
    store.append(&entries(3..=4, 2));
    store.sync().unwrap();
    let expected = read_back(&store);
    assert_eq!(
        expected.3.iter().map(|(index, term, _)| (*index, *term)).collect::<Vec<_>>(),
        [(1, 1), (2, 1), (3, 2), (4, 2)]
    );
    drop(store);
    for _ in 0..2 {
        let store = LogStore::open(dir.path(), None).unwrap();
        assert_eq!(read_back(&store), expected);
    }
}

#[test]
fn a_torn_last_record_is_cut_and_what_came_before_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=3, 1)]);
    let expected = read_back(&store);
    drop(store);
    let mut torn = Vec::new();
    encode_entry(&entry(4, 1, "torn"), &mut torn);
    for cut in 1..torn.len() {
        // Each start begins a segment: the tear is in the last one.
        let last = *wal::segments(dir.path()).unwrap().last().unwrap();
        let path = wal::segment_path(dir.path(), last);
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend_from_slice(&torn[..cut]);
        fs::write(&path, &bytes).unwrap();
        let store = LogStore::open(dir.path(), None).unwrap();
        assert_eq!(read_back(&store), expected, "cut at {cut}");
        assert_eq!(fs::read(&path).unwrap().len(), bytes.len() - cut, "cut off on disk");
    }
}

#[test]
fn a_restart_after_a_snapshot_keeps_only_what_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), None).unwrap();
    store.append(&entries(1..=10, 1));
    store.set_hard_state(&hard_state(1, 1, 8));
    store.sync().unwrap();
    let point = Point { index: 6, term: 1, conf_state: voters(&[1, 2]) };
    store.restart_after(&point).unwrap();
    assert_eq!(wal::segments(dir.path()).unwrap().len(), 1, "the older segments are removed");
    let expected = read_back(&store);
    assert_eq!((expected.1, expected.2), (7, 10));
    assert_eq!(store.term(6).unwrap(), 1);
    assert!(matches!(store.term(5), Err(raft::Error::Store(StorageError::Compacted))));
    assert!(matches!(
        store.entries(6, 8, None, GetEntriesContext::empty(false)),
        Err(raft::Error::Store(StorageError::Compacted))
    ));
    assert_eq!(expected.0 .1, voters(&[1, 2]));
    drop(store);
    let store = LogStore::open(dir.path(), Some(&point)).unwrap();
    assert_eq!(read_back(&store), expected);
    assert_eq!(store.hard_state().commit, 8);
}

/// A follower sent a snapshot from a leadership its own log does not
/// share: none of its entries after the snapshot's point may survive,
/// on this start or any later one.
#[test]
fn entries_of_an_older_leadership_past_a_snapshot_are_dropped_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=10, 1)]);
    drop(store);
    // The snapshot's manifest reached the disk; the log's restart did not.
    let point = Point { index: 8, term: 2, conf_state: voters(&[1, 2, 3]) };
    let mut store = LogStore::open(dir.path(), Some(&point)).unwrap();
    assert_eq!((store.first_index().unwrap(), Storage::last_index(&store).unwrap()), (9, 8));
    assert_eq!(store.term(8).unwrap(), 2);
    assert_eq!(store.hard_state().commit, 8);
    // The new leader's entries after it, then two more starts.
    store.append(&entries(9..=11, 2));
    store.sync().unwrap();
    let expected = read_back(&store);
    drop(store);
    for _ in 0..2 {
        let store = LogStore::open(dir.path(), Some(&point)).unwrap();
        assert_eq!(read_back(&store), expected);
        assert_eq!(store.initial_state().unwrap().conf_state, voters(&[1, 2, 3]));
    }
}

#[test]
fn a_snapshot_the_log_agrees_with_keeps_the_entries_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=4, 1), (5..=9, 2)]);
    drop(store);
    let point = Point { index: 6, term: 2, conf_state: voters(&[1]) };
    let store = LogStore::open(dir.path(), Some(&point)).unwrap();
    let (_, first, last, found) = read_back(&store);
    assert_eq!((first, last, found.len()), (7, 9, 3));
}

/// A crash while a restart removes the segments before it: those left
/// (in any order the directory kept) are superseded by its base.
#[test]
fn a_restart_that_removed_only_some_old_segments_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=3, 1)]);
    drop(store);
    let mut store = synced(dir.path(), &[(4..=6, 1)]);
    let old: Vec<(PathBuf, Vec<u8>)> = wal::segments(dir.path())
        .unwrap()
        .into_iter()
        .map(|segment| wal::segment_path(dir.path(), segment))
        .map(|path| (path.clone(), fs::read(&path).unwrap()))
        .collect();
    let point = Point { index: 5, term: 1, conf_state: voters(&[1]) };
    store.restart_after(&point).unwrap();
    let expected = read_back(&store);
    drop(store);
    // Only the later old segment comes back: its first entry, 4, follows
    // nothing the replay knows until the restart's base.
    let (path, bytes) = &old[1];
    fs::write(path, bytes).unwrap();
    let store = LogStore::open(dir.path(), Some(&point)).unwrap();
    assert_eq!(read_back(&store), expected);
    assert_eq!((expected.1, expected.2), (6, 6));
}

#[test]
fn a_restart_left_half_done_is_as_if_it_never_began() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=4, 1)]);
    let expected = read_back(&store);
    drop(store);
    fs::write(dir.path().join(format!("{:020}.partial", 99)), b"half a segment").unwrap();
    let store = LogStore::open(dir.path(), None).unwrap();
    assert_eq!(read_back(&store), expected);
    assert!(!dir.path().join(format!("{:020}.partial", 99)).exists());
}

#[test]
fn entries_are_cut_to_the_size_asked_but_never_to_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), None).unwrap();
    store.append(&entries(1..=6, 1));
    let context = || GetEntriesContext::empty(false);
    assert_eq!(store.entries(1, 7, 0, context()).unwrap().len(), 1);
    let one = ENTRY_OVERHEAD_BYTES + 3;
    assert_eq!(store.entries(2, 7, 2 * one, context()).unwrap().len(), 2);
    assert_eq!(store.entries(2, 7, None, context()).unwrap().len(), 5);
    assert!(matches!(store.term(7), Err(raft::Error::Store(StorageError::Unavailable))));
}

#[test]
fn a_gap_between_entries_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced(dir.path(), &[(1..=2, 1)]);
    drop(store);
    let last = *wal::segments(dir.path()).unwrap().last().unwrap();
    let mut bytes = fs::read(wal::segment_path(dir.path(), last)).unwrap();
    encode_entry(&entry(5, 1, "after a gap"), &mut bytes);
    fs::write(wal::segment_path(dir.path(), last), &bytes).unwrap();
    assert!(matches!(LogStore::open(dir.path(), None), Err(OpenError::Gap { after: 2, found: 5 })));
}

#[test]
fn every_record_reads_back_as_written() {
    let mut bytes = Vec::new();
    let mut conf_state = voters(&[1, 2, 3]);
    conf_state.learners = vec![7];
    conf_state.voters_outgoing = vec![1, 2, 4];
    conf_state.auto_leave = true;
    let mut change = entry(9, 4, "change");
    change.set_entry_type(EntryType::EntryConfChangeV2);
    change.context = b"context".to_vec().into();
    let entries = [entry(3, 2, "data"), change];
    for entry in &entries {
        encode_entry(entry, &mut bytes);
    }
    let others =
        [Item::HardState(hard_state(4, 2, 9)), Item::ConfState(9, conf_state), Item::Base { index: 11, term: 5 }];
    for item in &others {
        match item {
            Item::HardState(hard_state) => encode_hard_state(hard_state, &mut bytes),
            Item::ConfState(at, conf_state) => encode_conf_state(*at, conf_state, &mut bytes),
            Item::Base { index, term } => encode_base((*index, *term), &mut bytes),
            Item::Entry { .. } => unreachable!("entries are written above"),
        }
    }
    let mut read = Vec::new();
    assert_eq!(wal::scan(&bytes, decode, |item, _| read.push(item)), wal::ScanEnd::Clean);
    let heads = entries.iter().map(|e| Item::Entry { index: e.index, term: e.term, size: entry_size(e) });
    assert_eq!(read, heads.chain(others).collect::<Vec<_>>());
    // An entry's record read back whole: its data and context slices of the buffer.
    let buffer = Bytes::from(bytes);
    let mut at = 0;
    for expected in &entries {
        let (entry, len) = frame::decode(&buffer[at..], |kind, payload| read_entry(kind, payload, &buffer)).unwrap();
        assert_eq!(&entry, expected);
        assert!(buffer.as_ptr_range().contains(&entry.data.as_ptr()), "not a copy");
        at += len;
    }
}

/// A log with a varied history: entries of many sizes, hard states
/// between them, a suffix overwritten; returned with no more than
/// `cache_bytes` of its entries in memory.
fn varied(dir: &Path, cache_bytes: u64) -> LogStore {
    let mut store = LogStore::open(dir, None).unwrap();
    store.set_cache_bytes(cache_bytes);
    let sized = |index: u64, term: u64| entry(index, term, &"x".repeat((index * 37 % 500) as usize));
    for (range, term) in [(1..=20, 1), (21..=40, 1), (30..=45, 2), (46..=60, 3)] {
        store.append(&range.map(|index| sized(index, term)).collect::<Vec<_>>());
        store.set_hard_state(&hard_state(term, 1, 20));
        store.sync().unwrap();
    }
    store
}

#[test]
fn entries_out_of_memory_read_back_from_disk_as_appended() {
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = varied(reference_dir.path(), CACHE_BYTES_MAX);
    assert!(reference.kept.cached_from <= 1, "all in memory");
    let expected = read_back(&reference);
    assert_eq!((expected.1, expected.2), (1, 60));
    for cache_bytes in [0, 1_000, 5_000] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = varied(dir.path(), cache_bytes);
        assert!(store.kept.cached_bytes <= cache_bytes, "{} cached", store.kept.cached_bytes);
        let cached = store.kept.entries.iter().filter(|slot| slot.cached.is_some()).count();
        assert_eq!(store.kept.cached_from, 61 - cached as u64, "the last appended are the ones cached");
        assert_eq!(read_back(&store), expected, "cache {cache_bytes}");
        // Every range, cut to the sizes asked as from memory.
        for low in 1..=60 {
            for high in low + 1..=61 {
                for max_size in [Some(0), Some(2_000), None] {
                    let context = || GetEntriesContext::empty(false);
                    let found = store.entries(low, high, max_size, context()).unwrap();
                    assert_eq!(found, reference.entries(low, high, max_size, context()).unwrap());
                }
            }
        }
        // A restart after a snapshot carries entries kept, from disk too.
        let point = Point { index: 50, term: 3, conf_state: voters(&[1]) };
        store.restart_keeping(&point, 10).unwrap();
        // Entries are read through the segments' own handles, one each.
        let open: Vec<u64> = store.readers.keys().copied().collect();
        assert_eq!(open, wal::segments(dir.path()).unwrap());
        let after = read_back(&store);
        assert_eq!((after.1, after.2), (11, 60));
        assert_eq!(after.3[..], expected.3[10..]);
        store.append(&entries(61..=62, 3));
        store.sync().unwrap();
        let after = read_back(&store);
        drop(store);
        let store = LogStore::open(dir.path(), None).unwrap();
        assert!(read_back(&store) == after, "the same after a start");
        assert_eq!(store.kept.cached_bytes, 0, "nothing read into memory at a start");
    }
}

#[test]
fn an_entry_damaged_on_disk_is_an_error_not_a_wrong_entry() {
    let dir = tempfile::tempdir().unwrap();
    let store = varied(dir.path(), 0);
    let place = store.kept.entries[4].place;
    let path = wal::segment_path(dir.path(), place.segment);
    let mut bytes = fs::read(&path).unwrap();
    bytes[(place.offset + place.len / 2) as usize] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let context = || GetEntriesContext::empty(false);
    assert_eq!(store.entries(1, 5, None, context()).unwrap().len(), 4);
    match store.entries(3, 8, None, context()) {
        Err(raft::Error::Io(error)) => assert!(error.to_string().contains("entry 5 of the Raft log"), "{error}"),
        other => panic!("{other:?}"),
    }
}

/// Records read back leave the page cache in the whole pages they fill,
/// never the file's last page, which the log's next records go on, even
/// when they end at the file's end (where the kernel, asked to, drops a
/// last page that is not whole).
#[test]
fn records_read_back_keep_the_page_the_log_goes_on() {
    let Some(dir) = crate::files::dir_that_drops_pages("records read back keep the log's last page") else { return };
    let page = crate::files::page_bytes();
    let path = dir.path().join("segment");
    let file = File::create(&path).unwrap();
    // Large enough that whole blocks of pages (large folios) lie inside.
    let len = 1024 * page + 100;
    file.write_all_at(&vec![5u8; len as usize], 0).unwrap();
    file.sync_data().unwrap();
    let readers = BTreeMap::from([(7, File::open(&path).unwrap())]);
    let read = |places: &[Place]| {
        let mut read = 0;
        read_records(&readers, places, |_, record| {
            assert!(record.iter().all(|&b| b == 5));
            read += record.len() as u64;
            Ok(())
        })
        .unwrap();
        read
    };
    let place = |offset: u64, len: u64| Place { segment: 7, offset, len };
    // Within one page: nothing is dropped.
    assert_eq!(read(&[place(10, 50), place(70, 20)]), 70);
    assert!(crate::files::cached_pages(&path).iter().all(|&c| c));
    // From inside the first page to the file's end: pages between may go
    // (as whole as the kernel's own blocks of pages let it), the first and
    // the last stay.
    assert_eq!(read(&[place(100, 512 * page), place(100 + 512 * page, len - 100 - 512 * page)]), len - 100);
    let cached = crate::files::cached_pages(&path);
    assert!(cached[0] && cached[1024], "{cached:?}");
    assert!(cached.iter().filter(|&&c| !c).count() >= 512, "too few pages dropped: {cached:?}");
}

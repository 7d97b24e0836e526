//! Snapshots: one compact file per index, and a manifest naming them.
//!
//! ```text
//! snapshots/<generation>-<name>.snap
//!   magic "QUIVSNP1"  version:u32  dims:u32  metric:u8  p:f32  zero:[u8; 3]  count:u64
//!                                   (the codes of the log's create record; p is 0 but for lp)
//!   ids: i64 * count
//!   vectors: f32 * count * dims          (row after row)
//!   metadata: { len:u32 bytes } * count  (JSON object text; empty for {})
//!   crc: u32                             (CRC32C of everything before it)
//! MANIFEST
//!   magic "QUIVMAN1"  version:u32  zero:u32  generation:u64  log_start:u64  count:u32
//!   { len:u8 name } * count
//!   crc: u32                             (CRC32C of everything before it)
//! STATE                                  (a cluster's node, in place of MANIFEST)
//!   magic "QUIVSTA1"  version:u32  zero:u32  generation:u64  cluster_len:u32  cluster
//!   count:u32  { len:u8 name } * count
//!   crc: u32
//! ```
//!
//! A cluster's node has no write-ahead log of its own: its STATE names the
//! generation and, in `cluster` (bytes the cluster reads, opaque here), the
//! Raft entry the generation stands at, written in the same rename.
//! All little-endian. Every file is written to `<path>.tmp`, synced, renamed
//! into place, and its directory synced. The manifest is written last: until
//! it names a generation, that generation's files are not used.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::files::{self, sync_dir, Uncached};
use crate::store::aligned::Aligned;
use crate::store::index::Text;
use crate::store::{Index, Metric, Store};
use crate::wal::frame::Reader;

const SNAPSHOT_MAGIC: &[u8; 8] = b"QUIVSNP1";
const MANIFEST_MAGIC: &[u8; 8] = b"QUIVMAN1";
const VERSION: u32 = 1;
pub const MANIFEST: &str = "MANIFEST";

/// Why a snapshot or the manifest could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be opened or read.
    Io { path: PathBuf, source: io::Error },
    /// The file is not what it should be: a wrong header, a size that does
    /// not fit, a checksum that does not match.
    Damaged { path: PathBuf, why: String },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            LoadError::Damaged { path, why } => write!(f, "{} is damaged: {why}", path.display()),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Io { source, .. } => Some(source),
            LoadError::Damaged { .. } => None,
        }
    }
}

/// Which snapshots hold the state, and where the log resumes after them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub generation: u64,
    /// The first log segment not covered by the snapshots.
    pub log_start: u64,
    pub indexes: Vec<String>,
}

pub fn snapshot_path(dir: &Path, generation: u64, name: &str) -> PathBuf {
    dir.join(format!("{generation:020}-{name}.snap"))
}

/// The generation a snapshot file name (`.snap`, or `.tmp` while written) belongs to.
pub fn generation_of(file_name: &str) -> Option<u64> {
    file_name.split('-').next()?.parse().ok()
}

/// A writer that keeps the CRC32C of everything written through it.
struct Checksummed<W: Write> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.crc = crc32c::crc32c_append(self.crc, &bytes[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `path` whole or not at all (`files::write_atomically`), what
/// `fill` writes followed by its CRC32C. The caller syncs the directory.
/// Kept out of the page cache (`files::Uncached`): read only at the next
/// start, or sent once to a node behind.
fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut Checksummed<BufWriter<Uncached<'_>>>) -> io::Result<()>,
) -> io::Result<()> {
    files::write_atomically(path, |file| {
        let mut out = Checksummed { inner: BufWriter::with_capacity(1 << 20, Uncached::new(file)), crc: 0 };
        fill(&mut out)?;
        let crc = out.crc;
        out.write_all(&crc.to_le_bytes())?;
        out.flush()
    })
}

pub fn write_index(path: &Path, index: &Index) -> io::Result<()> {
    write_file(path, |out| write_rows(out, index))
}

/// An index's snapshot image, the bytes of its snapshot file (a download's
/// body), written to `out`.
pub fn write_image(out: &mut impl Write, index: &Index) -> io::Result<()> {
    let mut out = Checksummed { inner: out, crc: 0 };
    write_rows(&mut out, index)?;
    let crc = out.crc;
    out.inner.write_all(&crc.to_le_bytes())
}

/// How many bytes `write_image` writes for `index`.
pub fn image_bytes(index: &Index) -> u64 {
    let (ids, vectors, metadata) = index.parts();
    let metadata_bytes: u64 = metadata.iter().map(|text| 4 + text.len() as u64).sum();
    let header = SNAPSHOT_MAGIC.len() + 4 + 4 + 8 + 8;
    header as u64 + 8 * ids.len() as u64 + 4 * vectors.len() as u64 + metadata_bytes + 4
}

/// An index's header and rows, as its snapshot file holds them before the CRC.
fn write_rows(out: &mut impl Write, index: &Index) -> io::Result<()> {
    let (ids, vectors, metadata) = index.parts();
    out.write_all(SNAPSHOT_MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&(index.dims() as u32).to_le_bytes())?;
    let p = index.metric().power().unwrap_or(0.0).to_le_bytes();
    out.write_all(&[index.metric().code(), p[0], p[1], p[2], p[3], 0, 0, 0])?;
    out.write_all(&(ids.len() as u64).to_le_bytes())?;
    out.write_all(bytemuck::cast_slice(ids))?;
    out.write_all(bytemuck::cast_slice(vectors))?;
    for text in metadata {
        out.write_all(&(text.len() as u32).to_le_bytes())?;
        out.write_all(text)?;
    }
    Ok(())
}

/// A reader that keeps the CRC32C of everything read through it.
struct Verified<R: Read> {
    inner: R,
    crc: u32,
}

impl<R: Read> Verified<R> {
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.fill(&mut buf)?;
        Ok(buf)
    }
}

/// Bytes of vectors read between progress reports.
const LOAD_CHUNK_FLOATS: usize = 16 << 20;

/// Loads a snapshot, reading ids and vectors straight into their arrays.
pub fn load_index(path: &Path, progress: &mut crate::log::Progress) -> Result<Index, LoadError> {
    let unreadable = |source| LoadError::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(unreadable)?;
    let length = file.metadata().map_err(unreadable)?.len();
    read_index(io::BufReader::with_capacity(1 << 20, file), length, path, progress)
}

/// Loads a snapshot file's bytes held in memory (a state a leader sent);
/// `path` names it in errors.
pub fn load_index_bytes(bytes: &[u8], path: &Path, progress: &mut crate::log::Progress) -> Result<Index, LoadError> {
    read_index(bytes, bytes.len() as u64, path, progress)
}

/// An image's rows, read in place (`quiver export` from a download): the
/// header and the CRC32C checked, nothing built.
pub struct ImageRows<'a> {
    pub dims: usize,
    pub ids: Vec<i64>,
    /// The vectors' f32s, little-endian, row after row.
    pub vectors: &'a [u8],
    /// Each row's metadata text (empty for `{}`).
    pub metadata: Vec<&'a [u8]>,
}

/// Reads a snapshot image's rows; an error says what is wrong with it.
pub fn image_rows(bytes: &[u8]) -> Result<ImageRows<'_>, String> {
    let (body, crc) = bytes.split_at_checked(bytes.len().saturating_sub(4)).ok_or("cut short")?;
    if bytes.len() < 36 || &body[..8] != SNAPSHOT_MAGIC || body[8..12] != VERSION.to_le_bytes() {
        return Err("not a quiver snapshot of a known version".to_owned());
    }
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("checksum mismatch".to_owned());
    }
    let dims = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
    let count = u64::from_le_bytes(body[24..32].try_into().expect("8 bytes"));
    let rows_bytes = count.checked_mul(8 + 4 * dims as u64).filter(|&n| n <= body.len() as u64 - 32);
    let count = rows_bytes.map(|_| count as usize).ok_or("header does not match the size")?;
    let (ids, rest) = body[32..].split_at(count * 8);
    let (vectors, mut rest) = rest.split_at(count * dims * 4);
    let mut metadata = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, after) = rest.split_at_checked(4).ok_or("cut short")?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let (text, after) = after.split_at_checked(len).ok_or("metadata longer than the image")?;
        metadata.push(text);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes follow its rows", rest.len()));
    }
    let ids = ids.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    Ok(ImageRows { dims, ids, vectors, metadata })
}

/// Loads a snapshot image (a download, a restore's body), quietly: no
/// progress lines. `path` names it in errors.
pub fn load_image(bytes: &[u8], path: &Path) -> Result<Index, LoadError> {
    let mut rest = bytes;
    let index = read_index(&mut rest, bytes.len() as u64, path, &mut crate::log::Progress::quiet())?;
    if !rest.is_empty() {
        let why = format!("{} bytes follow its checksum", rest.len());
        return Err(LoadError::Damaged { path: path.to_owned(), why });
    }
    Ok(index)
}

/// Reads a snapshot file of `length` bytes from `source`, checking its CRC.
fn read_index(
    source: impl Read,
    length: u64,
    path: &Path,
    progress: &mut crate::log::Progress,
) -> Result<Index, LoadError> {
    let unreadable = |source| LoadError::Io { path: path.to_owned(), source };
    let mut input = Verified { inner: source, crc: 0 };
    let mut read = |input: &mut Verified<_>| -> io::Result<Index> {
        let magic: [u8; 8] = input.array()?;
        let version = u32::from_le_bytes(input.array()?);
        if &magic != SNAPSHOT_MAGIC || version != VERSION {
            return Err(io::Error::other("not a quiver snapshot of a known version"));
        }
        let dims = u32::from_le_bytes(input.array()?) as usize;
        let [metric, p @ .., _, _, _] = input.array::<8>()?;
        let count = u64::from_le_bytes(input.array()?);
        let metric =
            Metric::from_code(metric, f32::from_le_bytes(p)).ok_or_else(|| io::Error::other("unknown metric"))?;
        // Refuse sizes the file cannot hold before allocating for them.
        let row_bytes = 8 + 4 + 4 * dims as u64;
        if dims == 0 || count.saturating_mul(row_bytes) > length {
            return Err(io::Error::other("header does not match the file size"));
        }
        let count = count as usize;
        let mut ids = vec![0i64; count];
        input.fill(bytemuck::cast_slice_mut(&mut ids))?;
        progress.advance(count as u64 * 8);
        let mut vectors = Aligned::<f32>::zeroed(count * dims);
        vectors.fault_in();
        for chunk in vectors.chunks_mut(LOAD_CHUNK_FLOATS) {
            input.fill(bytemuck::cast_slice_mut(chunk))?;
            progress.advance(chunk.len() as u64 * 4);
        }
        let mut metadata = Vec::with_capacity(count);
        for _ in 0..count {
            let len = u32::from_le_bytes(input.array()?) as usize;
            if len as u64 > length {
                return Err(io::Error::other("metadata longer than the file"));
            }
            let mut text = Text::from_elem(0, len);
            input.fill(&mut text)?;
            metadata.push(text);
        }
        let computed = input.crc;
        let stored = u32::from_le_bytes(input.array()?);
        if computed != stored {
            return Err(io::Error::other("checksum mismatch"));
        }
        Index::from_parts(dims, metric, ids, vectors, metadata).map_err(io::Error::other)
    };
    read(&mut input).map_err(|error| match error.kind() {
        // A file shorter than its header says is damaged, not unreadable.
        io::ErrorKind::UnexpectedEof => {
            LoadError::Damaged { path: path.to_owned(), why: "cut short: it ends before its rows do".to_owned() }
        }
        io::ErrorKind::Other => LoadError::Damaged { path: path.to_owned(), why: error.to_string() },
        _ => unreadable(error),
    })
}

pub fn write_manifest(dir: &Path, manifest: &Manifest) -> io::Result<()> {
    write_generation(&dir.join(MANIFEST), MANIFEST_MAGIC, manifest.generation, &manifest.indexes, |out| {
        out.write_all(&manifest.log_start.to_le_bytes())
    })?;
    sync_dir(dir)
}

/// A MANIFEST or STATE: `magic version zero generation`, what `fill`
/// writes, then the names of the generation's indexes, and the CRC.
fn write_generation(
    path: &Path,
    magic: &[u8; 8],
    generation: u64,
    names: &[String],
    fill: impl FnOnce(&mut Checksummed<BufWriter<Uncached<'_>>>) -> io::Result<()>,
) -> io::Result<()> {
    write_file(path, |out| {
        out.write_all(magic)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&generation.to_le_bytes())?;
        fill(out)?;
        write_names(out, names)
    })
}

fn write_names(out: &mut impl Write, names: &[String]) -> io::Result<()> {
    out.write_all(&(names.len() as u32).to_le_bytes())?;
    for name in names {
        out.write_all(&[name.len() as u8])?;
        out.write_all(name.as_bytes())?;
    }
    Ok(())
}

/// A small file of `magic`, checked whole: its body after the magic and
/// version (read by `read`), or `None` if there is no such file.
fn read_checked<T>(
    path: &Path,
    magic: &[u8; 8],
    read: impl FnOnce(&mut Reader<'_>) -> Option<T>,
) -> Result<Option<T>, LoadError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LoadError::Io { path: path.to_owned(), source }),
    };
    let damaged = || LoadError::Damaged { path: path.to_owned(), why: "its checksum or layout is wrong".to_owned() };
    let (body, crc) = bytes.split_at_checked(bytes.len().saturating_sub(4)).ok_or_else(damaged)?;
    if body.len() < 12 || crc32c::crc32c(body).to_le_bytes() != crc || &body[..8] != magic {
        return Err(damaged());
    }
    let mut fields = Reader::new(&body[12..]);
    let value = read(&mut fields).ok_or_else(damaged)?;
    if fields.left() > 0 {
        return Err(damaged());
    }
    Ok(Some(value))
}

/// The manifest of `dir`, or `None` if there is none yet.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, LoadError> {
    read_checked(&dir.join(MANIFEST), MANIFEST_MAGIC, |fields| {
        fields.u32()?;
        let (generation, log_start) = (fields.u64()?, fields.u64()?);
        Some(Manifest { generation, log_start, indexes: names(fields)? })
    })
}

fn names(fields: &mut Reader<'_>) -> Option<Vec<String>> {
    let count = fields.u32()?;
    (0..count.min(fields.left()))
        .map(|_| fields.name())
        .collect::<Option<Vec<_>>>()
        .filter(|names| names.len() == count)
}

/// A cluster's node's state: the snapshots of generation `generation`,
/// and where in the Raft log they stand (`cluster`, the cluster's own bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub generation: u64,
    pub cluster: Vec<u8>,
    pub indexes: Vec<String>,
}

pub const STATE: &str = "STATE";
const STATE_MAGIC: &[u8; 8] = b"QUIVSTA1";

pub fn write_state(dir: &Path, state: &State) -> io::Result<()> {
    write_generation(&dir.join(STATE), STATE_MAGIC, state.generation, &state.indexes, |out| {
        out.write_all(&(state.cluster.len() as u32).to_le_bytes())?;
        out.write_all(&state.cluster)
    })?;
    sync_dir(dir)
}

/// The state of a cluster's node in `dir`, or `None` if it has none yet.
pub fn read_state(dir: &Path) -> Result<Option<State>, LoadError> {
    read_checked(&dir.join(STATE), STATE_MAGIC, |fields| {
        fields.u32()?;
        let generation = fields.u64()?;
        let len = fields.u32()?;
        let cluster = fields.take(len)?.to_vec();
        Some(State { generation, cluster, indexes: names(fields)? })
    })
}

/// Writes every index of `store` as generation `generation`, then the
/// manifest that makes them current. Used by the snapshot child and at shutdown.
pub fn write_all(
    data_dir: &Path,
    snapshots_dir: &Path,
    generation: u64,
    log_start: u64,
    store: &Store,
) -> io::Result<Manifest> {
    let manifest = Manifest { generation, log_start, indexes: write_indexes(snapshots_dir, generation, store)? };
    write_manifest(data_dir, &manifest)?;
    Ok(manifest)
}

/// Writes every index of `store` as generation `generation`, durably;
/// returns their names. Nothing uses them until a manifest or state names them.
pub fn write_indexes(snapshots_dir: &Path, generation: u64, store: &Store) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for (name, index) in store.indexes() {
        write_index(&snapshot_path(snapshots_dir, generation, name), index)?;
        names.push(name.to_owned());
    }
    sync_dir(snapshots_dir)?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_rows_read_what_write_image_wrote_and_refuse_damage() {
        let mut vectors = Aligned::<f32>::zeroed(6);
        vectors.copy_from_slice(&[1.5, -2.0, 0.0, 3.25, f32::MIN_POSITIVE, 7.0]);
        let metadata = vec![Text::from_slice(b"{\"k\":\"v\"}"), Text::default(), Text::from_slice(b"{}")];
        let index = Index::from_parts(2, Metric::Cosine, vec![3, -1, 8], vectors, metadata).unwrap();
        let mut image = Vec::new();
        write_image(&mut image, &index).unwrap();
        assert_eq!(image.len() as u64, image_bytes(&index));
        let rows = image_rows(&image).unwrap();
        let (ids, vectors, metadata) = index.parts();
        assert_eq!((rows.dims, rows.ids.as_slice()), (2, ids));
        assert_eq!(rows.vectors, bytemuck::cast_slice::<f32, u8>(vectors));
        assert!(rows.metadata.iter().zip(metadata).all(|(a, b)| *a == &b[..]));
        let mut flipped = image.clone();
        flipped[40] ^= 4;
        assert_eq!(image_rows(&flipped).err().as_deref(), Some("checksum mismatch"));
        assert!(image_rows(&image[..image.len() - 5]).is_err());
        assert!(image_rows(b"QUIVSNP1").is_err());
    }

    #[test]
    fn snapshot_and_manifest_round_trip_and_detect_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = Index::new(3, Metric::Cosine);
        index.upsert(4, &[1.0, 2.0, 3.0], b"{\"a\":\"b\"}");
        index.upsert(-9, &[0.5, f32::MIN_POSITIVE, -7.0], b"");
        let path = snapshot_path(dir.path(), 7, "idx");
        write_index(&path, &index).unwrap();
        let loaded = load_index(&path, &mut crate::log::Progress::new("test", 0)).unwrap();
        assert_eq!(loaded.parts(), index.parts());
        assert_eq!((loaded.dims(), loaded.metric()), (3, Metric::Cosine));
        assert_eq!(generation_of("00000000000000000007-idx.snap"), Some(7));
        assert_eq!(generation_of("00000000000000000008-idx.tmp"), Some(8));
        assert_eq!(generation_of("MANIFEST"), None);

        let mut bytes = fs::read(&path).unwrap();
        bytes[40] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let error = load_index(&path, &mut crate::log::Progress::new("test", 0)).unwrap_err();
        assert!(matches!(&error, LoadError::Damaged { why, .. } if why == "checksum mismatch"), "{error}");

        let manifest = Manifest { generation: 3, log_start: 12, indexes: vec!["a-b".into(), "xyz".into()] };
        write_manifest(dir.path(), &manifest).unwrap();
        assert_eq!(read_manifest(dir.path()).unwrap(), Some(manifest));
        let manifest_path = dir.path().join(MANIFEST);
        let mut bytes = fs::read(&manifest_path).unwrap();
        bytes[20] ^= 1;
        fs::write(&manifest_path, &bytes).unwrap();
        assert!(matches!(read_manifest(dir.path()), Err(LoadError::Damaged { .. })));
    }

    #[test]
    fn a_state_round_trips_and_a_damaged_or_cut_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_state(dir.path()).unwrap(), None);
        let state = State { generation: 9, cluster: vec![1, 2, 3, 250], indexes: vec!["docs".into(), "b".into()] };
        write_state(dir.path(), &state).unwrap();
        assert_eq!(read_state(dir.path()).unwrap(), Some(state));
        let path = dir.path().join(STATE);
        let bytes = fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            fs::write(&path, &bytes[..cut]).unwrap();
            assert!(matches!(read_state(dir.path()), Err(LoadError::Damaged { .. })), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[26] ^= 4;
        fs::write(&path, &flipped).unwrap();
        assert!(matches!(read_state(dir.path()), Err(LoadError::Damaged { .. })));
    }
}

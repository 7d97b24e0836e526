//! The file formats `quiver import` reads and `quiver export` writes: rows
//! of (id, vector, metadata), a batch at a time.
//!
//! - `.npy`: a 2-d float32 or float64 array, C or Fortran order, one row a
//!   vector. It holds no ids: they are `<stem>.ids.npy` (a 1-d int64 array)
//!   beside it if that exists, else the row numbers from `--id-start`; and
//!   no metadata.
//! - `.jsonl`: one object a line, `{"id": 7, "data": [...], "metadata": {...}}`
//!   (`vector` or `embedding` for `data`; `metadata` optional). Numbers are
//!   passed to the server as written, so it rounds each once, to f32.
//! - `.parquet`: an id column (int64 or int32, `--id-column`, default `id`;
//!   row numbers if absent), a vector column (a list or fixed-size list of
//!   float32 or float64: `--vector-column`, else the only list column), and
//!   metadata: a `metadata` column of JSON object text, or else every other
//!   column of strings, numbers or booleans, by name.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use npyz::WriterBuilder;

/// The formats, by the file's extension or `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Npy,
    Jsonl,
    Parquet,
}

impl Format {
    /// The format `--format` names, else the one the file's extension says.
    pub fn of(path: &Path, given: Option<Format>) -> Result<Format, String> {
        if let Some(format) = given {
            return Ok(format);
        }
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("npy") => Ok(Format::Npy),
            Some("jsonl" | "ndjson") => Ok(Format::Jsonl),
            Some("parquet") => Ok(Format::Parquet),
            _ => Err(format!(
                "{}: cannot tell the format from the extension (.npy, .jsonl, .parquet); give --format",
                path.display()
            )),
        }
    }
}

/// A batch of rows. A vector is either floats (`values`, row `i` ending at
/// `vector_ends[i]`) or, from JSON lines, its JSON text as written (`texts`).
#[derive(Default)]
pub struct Rows {
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
    pub vector_ends: Vec<usize>,
    pub texts: Vec<String>,
    /// Each row's metadata as a JSON object's text; empty for none.
    pub metadata: Vec<String>,
    /// Where each row starts in the file: its line (JSON lines) or row number.
    pub first_row: u64,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn clear(&mut self) {
        self.ids.clear();
        self.values.clear();
        self.vector_ends.clear();
        self.texts.clear();
        self.metadata.clear();
    }
}

/// Where rows come from.
pub enum Source {
    Npy {
        values: NpyValues,
        rows: usize,
        dims: usize,
        ids: Option<Vec<i64>>,
        id_start: i64,
        next: usize,
    },
    Jsonl {
        lines: io::Lines<BufReader<File>>,
        line: u64,
        path: PathBuf,
    },
    Parquet {
        reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
        columns: ParquetColumns,
        pending: Option<(RecordBatch, usize)>,
        row: u64,
    },
}

/// Which columns of a Parquet file hold what.
pub struct ParquetColumns {
    id: Option<usize>,
    vector: usize,
    /// A column of JSON object text, or columns named as metadata keys.
    metadata: MetadataColumns,
}

enum MetadataColumns {
    Json(usize),
    Named(Vec<(usize, String)>),
}

/// Options of reading.
pub struct ReadOptions<'a> {
    pub id_start: i64,
    pub id_column: &'a str,
    pub vector_column: Option<&'a str>,
}

impl Source {
    pub fn open(path: &Path, format: Format, options: &ReadOptions<'_>) -> Result<Source, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        match format {
            Format::Npy => {
                let (values, rows, dims) = read_npy_f32(path)?;
                let ids_path = path.with_extension("ids.npy");
                let ids = if ids_path.exists() {
                    let ids = read_npy_ids(&ids_path)?;
                    if ids.len() != rows {
                        return Err(format!("{}: {} ids for {rows} rows", ids_path.display(), ids.len()));
                    }
                    Some(ids)
                } else {
                    None
                };
                Ok(Source::Npy { values, rows, dims, ids, id_start: options.id_start, next: 0 })
            }
            Format::Jsonl => {
                let file = File::open(path).map_err(|e| at(&e))?;
                Ok(Source::Jsonl {
                    lines: BufReader::with_capacity(1 << 20, file).lines(),
                    line: 0,
                    path: path.to_owned(),
                })
            }
            Format::Parquet => {
                let file = File::open(path).map_err(|e| at(&e))?;
                let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .map_err(|e| at(&format!("not a Parquet file: {e}")))?;
                let columns = parquet_columns(builder.schema(), options).map_err(|e| at(&e))?;
                let reader = builder.with_batch_size(4096).build().map_err(|e| at(&e))?;
                Ok(Source::Parquet { reader, columns, pending: None, row: 0 })
            }
        }
    }

    /// How many rows the file holds, where that is known before reading.
    pub fn rows(&self) -> Option<u64> {
        match self {
            Source::Npy { rows, .. } => Some(*rows as u64),
            _ => None,
        }
    }

    /// The vectors' dimensions, where the file says so before its rows.
    pub fn dims(&self) -> Option<usize> {
        match self {
            Source::Npy { dims, .. } => Some(*dims),
            _ => None,
        }
    }

    /// Fills `out` with up to `max` rows; false when the file is done. An
    /// error names the row (or line) and what is wrong with it; the rows
    /// of the batch before it are dropped with it.
    pub fn next(&mut self, max: usize, out: &mut Rows) -> Result<bool, String> {
        out.clear();
        match self {
            Source::Npy { values, rows, dims, ids, id_start, next } => {
                out.first_row = *next as u64;
                let end = (*next + max).min(*rows);
                for row in *next..end {
                    let id = match ids {
                        Some(ids) => ids[row],
                        None => id_start.checked_add(row as i64).ok_or("--id-start: ids past 2^63")?,
                    };
                    out.ids.push(id);
                    out.metadata.push(String::new());
                    out.vector_ends.push((row + 1 - *next) * *dims);
                }
                values.take(*next * *dims..end * *dims, &mut out.values)?;
                *next = end;
                Ok(!out.is_empty())
            }
            Source::Jsonl { lines, line, path } => {
                out.first_row = *line + 1;
                while out.len() < max {
                    let Some(text) = lines.next() else { break };
                    *line += 1;
                    let at = |why: String| format!("{}: line {line}: {why}", path.display());
                    let text = text.map_err(|e| at(e.to_string()))?;
                    if text.trim().is_empty() {
                        continue;
                    }
                    let row: JsonRow<'_> =
                        serde_json::from_str(&text).map_err(|e| at(format!("not a row object: {e}")))?;
                    let vector =
                        row.data.or(row.vector).or(row.embedding).ok_or_else(|| at("no \"data\"".to_owned()))?;
                    if !vector.get().trim_start().starts_with('[') {
                        return Err(at("\"data\" is not an array".to_owned()));
                    }
                    let metadata = match row.metadata {
                        Some(m) if m.get().trim_start().starts_with('{') => m.get().to_owned(),
                        Some(m) if m.get().trim() == "null" => String::new(),
                        Some(_) => return Err(at("\"metadata\" is not an object".to_owned())),
                        None => String::new(),
                    };
                    out.ids.push(row.id);
                    out.texts.push(vector.get().to_owned());
                    out.metadata.push(metadata);
                }
                Ok(!out.is_empty())
            }
            Source::Parquet { reader, columns, pending, row } => {
                out.first_row = *row;
                while out.len() < max {
                    let (batch, from) = match pending.take() {
                        Some(pending) => pending,
                        None => match reader.next() {
                            Some(batch) => (batch.map_err(|e| format!("row {row}: {e}"))?, 0),
                            None => break,
                        },
                    };
                    let to = (from + max - out.len()).min(batch.num_rows());
                    parquet_rows(&batch, columns, from..to, *row, out)?;
                    *row += (to - from) as u64;
                    if to < batch.num_rows() {
                        *pending = Some((batch, to));
                    }
                }
                Ok(!out.is_empty())
            }
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRow<'a> {
    id: i64,
    #[serde(borrow)]
    data: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    vector: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    embedding: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a serde_json::value::RawValue>,
}

/// A `.npy` file's values, as f32 in C order: read as the import goes (C
/// order: memory stays one batch however large the file), or read whole
/// and reordered (Fortran order, whose rows are spread over the file).
pub enum NpyValues {
    Whole(Vec<f32>),
    Stream { values: Box<dyn Iterator<Item = io::Result<f32>>>, path: PathBuf },
}

impl NpyValues {
    /// Appends the values at `range` (the next ones, for a stream) to `out`.
    fn take(&mut self, range: std::ops::Range<usize>, out: &mut Vec<f32>) -> Result<(), String> {
        match self {
            NpyValues::Whole(values) => {
                out.extend_from_slice(&values[range]);
                Ok(())
            }
            NpyValues::Stream { values, path } => {
                out.reserve(range.len());
                for at in range {
                    match values.next() {
                        Some(Ok(x)) => out.push(x),
                        Some(Err(e)) => return Err(format!("{}: value {at}: {e}", path.display())),
                        None => return Err(format!("{}: cut short at value {at}", path.display())),
                    }
                }
                Ok(())
            }
        }
    }
}

/// A 2-d float array's values (float64 rounded once, to the nearest f32),
/// rows and dimensions. A file whose size is not what its header says is
/// refused before any row is read.
fn read_npy_f32(path: &Path) -> Result<(NpyValues, usize, usize), String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file_bytes = std::fs::metadata(path).map_err(|e| at(&e))?.len();
    let mut file = File::open(path).map_err(|e| at(&e))?;
    let data_at = npy_data_offset(&mut file).map_err(|e| at(&format!("not a .npy file: {e}")))?;
    io::Seek::rewind(&mut file).map_err(|e| at(&e))?;
    let npy = npyz::NpyFile::new(BufReader::with_capacity(1 << 20, file))
        .map_err(|e| at(&format!("not a .npy file: {e}")))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&n| n as usize).collect();
    let [rows, dims] = shape[..] else {
        return Err(at(&format!("a {}-d array; import takes a 2-d array, one row a vector", shape.len())));
    };
    let width = match npy.dtype() {
        npyz::DType::Plain(kind)
            if kind.type_char() == npyz::TypeChar::Float && [4, 8].contains(&kind.size_field()) =>
        {
            kind.size_field()
        }
        other => return Err(at(&format!("holds {}, not float32 or float64", other.descr()))),
    };
    let data_bytes = (rows as u64).checked_mul(dims as u64).and_then(|n| n.checked_mul(width));
    if data_bytes.and_then(|n| n.checked_add(data_at)) != Some(file_bytes) {
        return Err(at(&format!(
            "its header promises {rows} x {dims} values of {width} bytes, and the file holds {} bytes of data: \
             cut short or not a .npy file",
            file_bytes.saturating_sub(data_at)
        )));
    }
    let order = npy.order();
    let values: Box<dyn Iterator<Item = io::Result<f32>>> = match width {
        4 => Box::new(npy.data::<f32>().map_err(|e| at(&e))?),
        _ => Box::new(npy.data::<f64>().map_err(|e| at(&e))?.map(|x| x.map(|x| x as f32))),
    };
    let mut values = NpyValues::Stream { values, path: path.to_owned() };
    if order == npyz::Order::C {
        return Ok((values, rows, dims));
    }
    let mut columns = Vec::new();
    values.take(0..rows * dims, &mut columns)?;
    let mut c = vec![0f32; columns.len()];
    for (column, chunk) in columns.chunks_exact(rows.max(1)).enumerate().take(dims) {
        for (row, &x) in chunk.iter().enumerate() {
            c[row * dims + column] = x;
        }
    }
    Ok((NpyValues::Whole(c), rows, dims))
}

/// Where a `.npy` file's data starts: after the magic string, the version,
/// the header's length (2 bytes in version 1, 4 after) and the header.
fn npy_data_offset(file: &mut File) -> io::Result<u64> {
    let mut head = [0u8; 12];
    io::Read::read_exact(file, &mut head)?;
    if &head[..6] != b"\x93NUMPY" {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "no NumPy magic string"));
    }
    Ok(match head[6] {
        1 => 10 + u64::from(u16::from_le_bytes([head[8], head[9]])),
        _ => 12 + u64::from(u32::from_le_bytes([head[8], head[9], head[10], head[11]])),
    })
}

/// A 1-d int64 (or int32) array of ids.
fn read_npy_ids(path: &Path) -> Result<Vec<i64>, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = BufReader::new(File::open(path).map_err(|e| at(&e))?);
    let npy = npyz::NpyFile::new(file).map_err(|e| at(&format!("not a .npy file: {e}")))?;
    match npy.dtype() {
        npyz::DType::Plain(kind) if kind.type_char() == npyz::TypeChar::Int && kind.size_field() == 8 => {
            npy.into_vec::<i64>().map_err(|e| at(&e))
        }
        npyz::DType::Plain(kind) if kind.type_char() == npyz::TypeChar::Int && kind.size_field() == 4 => {
            Ok(npy.into_vec::<i32>().map_err(|e| at(&e))?.into_iter().map(i64::from).collect())
        }
        other => Err(at(&format!("holds {}, not int64 ids", other.descr()))),
    }
}

fn parquet_columns(schema: &Schema, options: &ReadOptions<'_>) -> Result<ParquetColumns, String> {
    let is_list = |t: &DataType| match t {
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            matches!(item.data_type(), DataType::Float32 | DataType::Float64)
        }
        _ => false,
    };
    let vector = match options.vector_column {
        Some(name) => schema.index_of(name).map_err(|_| format!("no column '{name}' (--vector-column)"))?,
        None => {
            let lists: Vec<usize> =
                (0..schema.fields().len()).filter(|&i| is_list(schema.field(i).data_type())).collect();
            match lists[..] {
                [one] => one,
                [] => return Err("no column of float lists to take the vectors from".to_owned()),
                _ => return Err("several columns of float lists: name the vectors' with --vector-column".to_owned()),
            }
        }
    };
    if !is_list(schema.field(vector).data_type()) {
        return Err(format!("column '{}' is not a list of floats", schema.field(vector).name()));
    }
    let id = schema.index_of(options.id_column).ok();
    if let Some(id) = id {
        if !matches!(schema.field(id).data_type(), DataType::Int64 | DataType::Int32) {
            return Err(format!("column '{}' (the ids) is not int64 or int32", options.id_column));
        }
    }
    let metadata = match schema.index_of("metadata") {
        Ok(at) if matches!(schema.field(at).data_type(), DataType::Utf8 | DataType::LargeUtf8) => {
            MetadataColumns::Json(at)
        }
        _ => MetadataColumns::Named(
            (0..schema.fields().len())
                .filter(|&i| i != vector && Some(i) != id)
                .filter(|&i| {
                    let t = schema.field(i).data_type();
                    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Boolean) || t.is_numeric()
                })
                .map(|i| (i, schema.field(i).name().clone()))
                .collect(),
        ),
    };
    Ok(ParquetColumns { id, vector, metadata })
}

/// Rows `range` of `batch` into `out`; `first` is the file's row number of the batch's first.
fn parquet_rows(
    batch: &RecordBatch,
    columns: &ParquetColumns,
    range: std::ops::Range<usize>,
    first: u64,
    out: &mut Rows,
) -> Result<(), String> {
    let vectors = batch.column(columns.vector);
    for row in range.clone() {
        let number = first + (row - range.start) as u64;
        let bad = |why: &str| format!("row {number}: {why}");
        let id = match columns.id {
            Some(at) => {
                let column = batch.column(at);
                if column.is_null(row) {
                    return Err(bad("the id is null"));
                }
                match column.data_type() {
                    DataType::Int64 => column.as_primitive::<Int64Type>().value(row),
                    _ => i64::from(column.as_primitive::<Int32Type>().value(row)),
                }
            }
            None => number as i64,
        };
        if vectors.is_null(row) {
            return Err(bad("the vector is null"));
        }
        let vector: ArrayRef = match vectors.data_type() {
            DataType::List(_) => vectors.as_list::<i32>().value(row),
            DataType::LargeList(_) => vectors.as_list::<i64>().value(row),
            _ => vectors.as_fixed_size_list().value(row),
        };
        if vector.null_count() > 0 {
            return Err(bad("the vector holds a null"));
        }
        match vector.data_type() {
            DataType::Float32 => out.values.extend_from_slice(vector.as_primitive::<Float32Type>().values()),
            _ => out.values.extend(vector.as_primitive::<Float64Type>().values().iter().map(|&x| x as f32)),
        }
        out.ids.push(id);
        out.metadata.push(parquet_metadata(batch, &columns.metadata, row).map_err(|e| bad(&e))?);
        out.vector_ends.push(out.values.len());
    }
    Ok(())
}

fn parquet_metadata(batch: &RecordBatch, columns: &MetadataColumns, row: usize) -> Result<String, String> {
    match columns {
        MetadataColumns::Json(at) => {
            let column = batch.column(*at);
            if column.is_null(row) {
                return Ok(String::new());
            }
            let text = match column.data_type() {
                DataType::Utf8 => column.as_string::<i32>().value(row),
                _ => column.as_string::<i64>().value(row),
            };
            // One JSON object and nothing more: the text goes into a request as it is.
            let value: &serde_json::value::RawValue =
                serde_json::from_str(text).map_err(|e| format!("column 'metadata': not JSON: {e}"))?;
            if !value.get().starts_with('{') {
                return Err("column 'metadata': not a JSON object".to_owned());
            }
            Ok(text.to_owned())
        }
        MetadataColumns::Named(named) => {
            let mut object = serde_json::Map::new();
            for (at, name) in named {
                let column = batch.column(*at);
                if column.is_null(row) {
                    continue;
                }
                let value =
                    arrow_value(column, row).ok_or_else(|| format!("column '{name}' holds a value metadata cannot"))?;
                object.insert(name.clone(), value);
            }
            Ok(if object.is_empty() { String::new() } else { serde_json::Value::Object(object).to_string() })
        }
    }
}

fn arrow_value(column: &ArrayRef, row: usize) -> Option<serde_json::Value> {
    use arrow_array::types::*;
    use serde_json::Value;
    Some(match column.data_type() {
        DataType::Utf8 => Value::from(column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Value::from(column.as_string::<i64>().value(row)),
        DataType::Boolean => Value::from(column.as_boolean().value(row)),
        DataType::Int8 => Value::from(column.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(column.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => Value::from(column.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(column.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::from(column.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(column.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => Value::from(column.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(column.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => Value::from(f64::from(column.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => Value::from(column.as_primitive::<Float64Type>().value(row)),
        _ => return None,
    })
}

/// Where exported rows go.
pub enum Sink {
    /// Held until the end: a .npy's header gives its row count first.
    Npy {
        path: PathBuf,
        dims: usize,
        values: Vec<f32>,
        ids: Vec<i64>,
        metadata_rows: u64,
    },
    Jsonl {
        out: BufWriter<File>,
        path: PathBuf,
    },
    Parquet {
        writer: Box<parquet::arrow::ArrowWriter<File>>,
        schema: Arc<Schema>,
        dims: usize,
        path: PathBuf,
    },
}

/// Rows in one row group of an exported Parquet file: 100 MB of vectors at
/// 768 dimensions, few enough that the writer's buffers stay small, many
/// enough that a reader's row groups are large.
const PARQUET_ROW_GROUP_ROWS: usize = 32_768;

impl Sink {
    pub fn create(path: &Path, format: Format, dims: usize) -> Result<Sink, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        Ok(match format {
            Format::Npy => {
                Sink::Npy { path: path.to_owned(), dims, values: Vec::new(), ids: Vec::new(), metadata_rows: 0 }
            }
            Format::Jsonl => {
                let file = File::create(path).map_err(|e| at(&e))?;
                Sink::Jsonl { out: BufWriter::with_capacity(1 << 20, file), path: path.to_owned() }
            }
            Format::Parquet => {
                let item = Arc::new(Field::new("item", DataType::Float32, false));
                let schema = Arc::new(Schema::new(vec![
                    Field::new("id", DataType::Int64, false),
                    Field::new("vector", DataType::FixedSizeList(item, dims as i32), false),
                    Field::new("metadata", DataType::Utf8, true),
                ]));
                let file = File::create(path).map_err(|e| at(&e))?;
                // No dictionaries: float vectors seldom repeat, and trying
                // costs. Statistics only for the ids, the one column a
                // reader may skip row groups by; row groups of a bounded
                // size, written as they fill rather than held to the end.
                use parquet::file::properties::{EnabledStatistics, WriterProperties};
                let properties = WriterProperties::builder()
                    .set_dictionary_enabled(false)
                    .set_statistics_enabled(EnabledStatistics::None)
                    .set_column_statistics_enabled("id".into(), EnabledStatistics::Chunk)
                    .set_max_row_group_row_count(Some(PARQUET_ROW_GROUP_ROWS))
                    .build();
                let writer =
                    parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(properties)).map_err(|e| at(&e))?;
                Sink::Parquet { writer: Box::new(writer), schema, dims, path: path.to_owned() }
            }
        })
    }

    /// Writes a batch of float rows, each of the index's dimensions. It may
    /// take the batch's ids and values rather than copy them (Parquet's
    /// arrays own theirs): the caller clears the batch before the next.
    pub fn write(&mut self, rows: &mut Rows) -> Result<(), String> {
        match self {
            Sink::Npy { values, ids, metadata_rows, .. } => {
                values.extend_from_slice(&rows.values);
                ids.extend_from_slice(&rows.ids);
                *metadata_rows += rows.metadata.iter().filter(|m| !m.is_empty()).count() as u64;
                Ok(())
            }
            Sink::Jsonl { out, path } => {
                let mut line = Vec::with_capacity(4096);
                let mut start = 0;
                for (row, &end) in rows.vector_ends.iter().enumerate() {
                    line.clear();
                    line.extend_from_slice(b"{\"id\":");
                    line.extend_from_slice(itoa::Buffer::new().format(rows.ids[row]).as_bytes());
                    line.extend_from_slice(b",\"data\":");
                    crate::api::json::write_f32_array(&mut line, &rows.values[start..end]);
                    if !rows.metadata[row].is_empty() {
                        line.extend_from_slice(b",\"metadata\":");
                        line.extend_from_slice(rows.metadata[row].as_bytes());
                    }
                    line.extend_from_slice(b"}\n");
                    out.write_all(&line).map_err(|e| format!("{}: {e}", path.display()))?;
                    start = end;
                }
                Ok(())
            }
            Sink::Parquet { writer, schema, dims, path } => {
                let item = Arc::new(Field::new("item", DataType::Float32, false));
                let vectors = FixedSizeListArray::try_new(
                    item,
                    *dims as i32,
                    Arc::new(Float32Array::from(std::mem::take(&mut rows.values))),
                    None,
                )
                .map_err(|e| format!("{}: {e}", path.display()))?;
                let metadata: StringArray =
                    rows.metadata.iter().map(|m| (!m.is_empty()).then_some(m.as_str())).collect();
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(std::mem::take(&mut rows.ids))),
                        Arc::new(vectors),
                        Arc::new(metadata),
                    ],
                )
                .map_err(|e| format!("{}: {e}", path.display()))?;
                writer.write(&batch).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// Completes the file; for .npy, says how many rows' metadata it could not hold.
    pub fn finish(self) -> Result<u64, String> {
        match self {
            Sink::Npy { path, dims, values, ids, metadata_rows } => {
                let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
                let rows = ids.len() as u64;
                let file = BufWriter::new(File::create(&path).map_err(|e| at(&e))?);
                let mut writer = npyz::WriteOptions::new()
                    .default_dtype()
                    .shape(&[rows, dims as u64])
                    .writer(file)
                    .begin_nd()
                    .map_err(|e| at(&e))?;
                writer.extend(values.iter().copied()).map_err(|e| at(&e))?;
                writer.finish().map_err(|e| at(&e))?;
                let ids_path = path.with_extension("ids.npy");
                let file = BufWriter::new(File::create(&ids_path).map_err(|e| at(&e))?);
                let mut writer = npyz::WriteOptions::new()
                    .default_dtype()
                    .shape(&[rows])
                    .writer(file)
                    .begin_nd()
                    .map_err(|e| at(&e))?;
                writer.extend(ids.iter().copied()).map_err(|e| at(&e))?;
                writer.finish().map_err(|e| at(&e))?;
                Ok(metadata_rows)
            }
            Sink::Jsonl { mut out, path } => {
                out.flush().map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(0)
            }
            Sink::Parquet { writer, path, .. } => {
                writer.close().map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(0)
            }
        }
    }
}

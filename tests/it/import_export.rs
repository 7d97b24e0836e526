//! `quiver import` and `quiver export` against the real server: every file
//! format in (npy C and Fortran, float32 and float64; JSON lines; Parquet
//! with list and fixed-size list columns), every format out and back, a
//! second run resuming a first, and bad files failing clearly with nothing
//! imported beyond the rows the summary reports.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float64Array, Int64Array, ListArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use npyz::WriterBuilder;
use serde_json::{json, Value};

use crate::harness::{create_index, Rng, Server, KEY};

const DIMS: usize = 24;

/// Runs `quiver <tool> --url ... --index NAME FILE extra...`; its exit
/// status and what it said.
fn tool(server: &Server, which: &str, index: &str, file: &Path, extra: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args([which, "--url", &format!("http://{}", server.addr), "--index", index])
        .args(extra)
        .arg(file)
        .env("QUIVER_API_KEY", KEY)
        .output()
        .unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// An index's rows by id: the vector's f32 bits and the metadata.
fn stored(server: &Server, index: &str) -> BTreeMap<i64, (Vec<u32>, Value)> {
    let mut rows = BTreeMap::new();
    let mut after = Value::Null;
    loop {
        let body = json!({"include": ["data"], "limit": 1000, "after": after}).to_string();
        let r = server.call("POST", &format!("/api/v1/embeddings/{index}/scroll"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
        for row in r.body["data"]["embeddings"].as_array().unwrap() {
            let bits = row["data"].as_array().unwrap().iter().map(|x| (x.as_f64().unwrap() as f32).to_bits()).collect();
            rows.insert(row["id"].as_i64().unwrap(), (bits, row["metadata"].clone()));
        }
        after = r.body["data"]["next"].clone();
        if after.is_null() {
            return rows;
        }
    }
}

struct Data {
    ids: Vec<i64>,
    vectors: Vec<Vec<f32>>,
    metadata: Vec<Value>,
}

fn data(rows: usize, seed: u64) -> Data {
    let mut rng = Rng(seed);
    let ids = (0..rows as i64).map(|i| i * 13 - 500).collect();
    let vectors = (0..rows).map(|_| (0..DIMS).map(|_| rng.float() * 4.0).collect()).collect();
    let metadata =
        (0..rows).map(|i| if i % 3 == 0 { json!({}) } else { json!({"tag": format!("t{}", i % 5), "n": i}) }).collect();
    Data { ids, vectors, metadata }
}

fn expected(data: &Data) -> BTreeMap<i64, (Vec<u32>, Value)> {
    (0..data.ids.len())
        .map(|i| (data.ids[i], (data.vectors[i].iter().map(|x| x.to_bits()).collect(), data.metadata[i].clone())))
        .collect()
}

fn write_npy<T: npyz::Serialize + npyz::AutoSerialize + Copy>(path: &Path, shape: &[u64], values: &[T], fortran: bool) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let order = if fortran { npyz::Order::Fortran } else { npyz::Order::C };
    let mut writer =
        npyz::WriteOptions::new().default_dtype().shape(shape).order(order).writer(file).begin_nd().unwrap();
    writer.extend(values.iter().copied()).unwrap();
    writer.finish().unwrap();
}

fn write_jsonl(path: &Path, data: &Data) {
    let lines: Vec<String> = (0..data.ids.len())
        .map(|i| json!({"id": data.ids[i], "data": data.vectors[i], "metadata": data.metadata[i]}).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Parquet: the vectors as a list of float32 (or a fixed-size list of
/// float64), metadata as named columns (or one column of JSON text).
fn write_parquet(path: &Path, data: &Data, fixed_f64: bool) {
    let flat: Vec<f32> = data.vectors.iter().flatten().copied().collect();
    let (vector_field, vectors): (Field, ArrayRef) = if fixed_f64 {
        let item = Arc::new(Field::new("item", DataType::Float64, false));
        let values = Float64Array::from(flat.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
        let array = FixedSizeListArray::new(item.clone(), DIMS as i32, Arc::new(values), None);
        (Field::new("embedding", DataType::FixedSizeList(item, DIMS as i32), false), Arc::new(array))
    } else {
        let rows = data.vectors.iter().map(|v| Some(v.iter().map(|&x| Some(x)).collect::<Vec<_>>()));
        let array = ListArray::from_iter_primitive::<arrow_array::types::Float32Type, _, _>(rows);
        let field = Field::new("embedding", array.data_type().clone(), false);
        (field, Arc::new(array))
    };
    let mut fields = vec![Field::new("id", DataType::Int64, false), vector_field];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(data.ids.clone())), vectors];
    if fixed_f64 {
        fields.push(Field::new("metadata", DataType::Utf8, true));
        let text: StringArray = data.metadata.iter().map(|m| Some(m.to_string())).collect();
        columns.push(Arc::new(text));
    } else {
        fields.push(Field::new("tag", DataType::Utf8, true));
        fields.push(Field::new("n", DataType::Int64, true));
        let tags: StringArray = data.metadata.iter().map(|m| m["tag"].as_str().map(str::to_owned)).collect();
        let ns: Int64Array = data.metadata.iter().map(|m| m["n"].as_i64()).collect();
        columns.push(Arc::new(tags));
        columns.push(Arc::new(ns));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

#[test]
fn every_format_goes_in_and_comes_back_out_bit_for_bit() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let data = data(700, 5);
    let want = expected(&data);
    let no_metadata: BTreeMap<i64, (Vec<u32>, Value)> =
        want.iter().map(|(&id, (v, _))| (id, (v.clone(), json!({})))).collect();
    let flat: Vec<f32> = data.vectors.iter().flatten().copied().collect();
    let mut column_major = vec![0f64; flat.len()];
    for (row, vector) in data.vectors.iter().enumerate() {
        for (d, &x) in vector.iter().enumerate() {
            column_major[d * data.ids.len() + row] = f64::from(x);
        }
    }
    let files = [
        ("c.npy", None),
        ("fortran.npy", None),
        ("rows.jsonl", Some(&want)),
        ("list.parquet", Some(&want)),
        ("fixed.parquet", Some(&want)),
    ];
    write_npy(&dir.path().join("c.npy"), &[700, DIMS as u64], &flat, false);
    write_npy(&dir.path().join("c.ids.npy"), &[700], &data.ids, false);
    write_npy(&dir.path().join("fortran.npy"), &[700, DIMS as u64], &column_major, true);
    write_npy(&dir.path().join("fortran.ids.npy"), &[700], &data.ids, false);
    write_jsonl(&dir.path().join("rows.jsonl"), &data);
    write_parquet(&dir.path().join("list.parquet"), &data, false);
    write_parquet(&dir.path().join("fixed.parquet"), &data, true);
    for (n, (file, metadata)) in files.iter().enumerate() {
        let index = format!("in-{n}");
        create_index(&server, &index, DIMS, "l2");
        let (status, said) = tool(&server, "import", &index, &dir.path().join(file), &["--batch-rows", "150"]);
        assert_eq!(status, 0, "{file}: {said}");
        assert!(said.contains("700 rows of ") && said.contains("700 inserted, 0 already present"), "{file}: {said}");
        assert_eq!(stored(&server, &index), *metadata.unwrap_or(&no_metadata), "{file}");
    }
    // Out in each format, and back in: the same rows.
    for format in ["npy", "jsonl", "parquet"] {
        let file = dir.path().join(format!("out.{format}"));
        let (status, said) = tool(&server, "export", "in-2", &file, &[]);
        assert_eq!(status, 0, "{said}");
        assert!(said.contains("700 rows of 'in-2' written to "), "{said}");
        let back = format!("back-{format}");
        create_index(&server, &back, DIMS, "l2");
        let (status, said) = tool(&server, "import", &back, &file, &[]);
        assert_eq!(status, 0, "{said}");
        let expect = if format == "npy" { &no_metadata } else { &want };
        assert_eq!(stored(&server, &back), *expect, "{format}");
        if format == "npy" {
            assert!(said.is_empty() || !said.contains("refused:"), "{said}");
        }
    }
    // The rows a filter matches, and nothing else, counted in the summary.
    let matching = data.metadata.iter().filter(|m| m["tag"] == "t1").count();
    for format in ["jsonl", "parquet", "npy"] {
        let file = dir.path().join(format!("t1.{format}"));
        let (status, said) = tool(&server, "export", "in-2", &file, &["--filter", r#"{"tag":"t1"}"#]);
        assert_eq!(status, 0, "{said}");
        assert!(said.contains(&format!("{matching} rows of 'in-2' written to ")), "{format}: {said}");
    }
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("t1.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), matching);
    assert!(lines.iter().all(|l| l["metadata"]["tag"] == "t1"));
}

#[test]
fn a_second_import_resumes_and_upsert_overwrites() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let data = data(500, 9);
    let file = dir.path().join("rows.jsonl");
    write_jsonl(
        &file,
        &Data {
            ids: data.ids[..200].to_vec(),
            vectors: data.vectors[..200].to_vec(),
            metadata: data.metadata[..200].to_vec(),
        },
    );
    create_index(&server, "resumed", DIMS, "cosine");
    assert_eq!(tool(&server, "import", "resumed", &file, &[]).0, 0);
    write_jsonl(&file, &data);
    let (status, said) = tool(&server, "import", "resumed", &file, &["--parallel", "3", "--batch-rows", "64"]);
    assert_eq!(status, 0, "{said}");
    assert!(said.contains("300 inserted, 200 already present"), "{said}");
    assert_eq!(stored(&server, "resumed"), expected(&data));
    let changed = Data {
        ids: data.ids.clone(),
        vectors: data.vectors.iter().map(|v| v.iter().map(|x| x + 1.0).collect()).collect(),
        metadata: data.metadata.clone(),
    };
    write_jsonl(&file, &changed);
    let (status, said) = tool(&server, "import", "resumed", &file, &["--mode", "upsert"]);
    assert_eq!(status, 0, "{said}");
    assert!(said.contains("500 upserted"), "{said}");
    assert_eq!(stored(&server, "resumed"), expected(&changed));
}

#[test]
fn bad_files_fail_clearly_with_nothing_beyond_the_rows_reported() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let data = data(400, 13);
    let count = |index: &str| {
        server.call("GET", &format!("/api/v1/indexes/{index}/stats"), None).body["data"]["count"].as_u64().unwrap()
    };

    // A malformed line stops the reading: the batches before it are in, no row after.
    let mut lines: Vec<String> =
        (0..400).map(|i| json!({"id": data.ids[i], "data": data.vectors[i]}).to_string()).collect();
    lines[249] = "{\"id\": 7, \"data\": [1, 2".to_owned();
    let file = dir.path().join("broken.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    create_index(&server, "broken", DIMS, "l2");
    let (status, said) = tool(&server, "import", "broken", &file, &["--batch-rows", "100"]);
    assert_eq!(status, 1, "{said}");
    assert!(said.contains("broken.jsonl: line 250: not a row object"), "{said}");
    assert!(said.contains("200 rows of ") && said.contains("200 inserted"), "{said}");
    assert_eq!(count("broken"), 200);

    // Rows the server refuses are named; the others go in.
    let mut vectors = data.vectors.clone();
    vectors[10] = vec![0.0; DIMS];
    vectors[20][3] = f32::NAN;
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    let npy = dir.path().join("nan.npy");
    write_npy(&npy, &[400, DIMS as u64], &flat, false);
    create_index(&server, "refusing", DIMS, "cosine");
    let (status, said) = tool(&server, "import", "refusing", &npy, &["--id-start", "1000"]);
    assert_eq!(status, 1, "{said}");
    assert!(said.contains("398 inserted, 0 already present (left as they were), 2 refused"), "{said}");
    assert!(said.contains("refused: id 1020: a value is not a finite number"), "{said}");
    assert!(said.contains("embedding with ID 1010 was not inserted"), "a zero vector under cosine: {said}");
    assert_eq!(count("refusing"), 398);

    // A row refused here (not finite) and one the server refuses whole
    // (nested metadata) in one batch: each counted once, the rest in.
    let mut doctored = Data {
        ids: data.ids[..50].to_vec(),
        vectors: data.vectors[..50].to_vec(),
        metadata: data.metadata[..50].to_vec(),
    };
    doctored.vectors[3][0] = f32::INFINITY;
    doctored.metadata[7] = json!({"nested": {"no": 1}});
    let parquet = dir.path().join("doctored.parquet");
    write_parquet(&parquet, &doctored, true);
    create_index(&server, "doctored", DIMS, "l2");
    let (status, said) = tool(&server, "import", "doctored", &parquet, &[]);
    assert_eq!(status, 1, "{said}");
    assert!(said.contains("48 inserted, 0 already present (left as they were), 2 refused"), "{said}");
    assert_eq!(said.matches("refused: ").count(), 2, "{said}");
    assert_eq!(count("doctored"), 48);

    // Files that are not what they say, dimensions that do not fit, a wrong key: nothing sent.
    let cut = dir.path().join("cut.npy");
    let bytes = std::fs::read(&npy).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let wrong = dir.path().join("wide.npy");
    write_npy(&wrong, &[2, 3], &[1f32, 2.0, 3.0, 4.0, 5.0, 6.0], false);
    let fake = dir.path().join("fake.parquet");
    std::fs::write(&fake, b"PAR1 not really").unwrap();
    create_index(&server, "untouched", DIMS, "l2");
    for (file, said) in [
        (&cut, "cut.npy: "),
        (&wrong, "wide.npy: vectors of 3 dimensions; index 'untouched' has 24"),
        (&fake, "fake.parquet: not a Parquet file"),
        (&dir.path().join("nowhere.jsonl"), "nowhere.jsonl: No such file"),
        (&dir.path().join("rows.csv"), "cannot tell the format from the extension"),
    ] {
        let (status, out) = tool(&server, "import", "untouched", file, &[]);
        assert_eq!(status, 1, "{out}");
        assert!(out.contains(said), "{said}: {out}");
    }
    let (status, out) = tool(&server, "import", "missing", &npy, &[]);
    assert!(status == 1 && out.contains("index 'missing': 500 INDEX_NOT_FETCHED"), "{out}");
    let output = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["import", "--url", &format!("http://{}", server.addr), "--index", "untouched", "--api-key", "wrong-key"])
        .arg(&npy)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.code() == Some(1) && out.contains("401 INVALID_API_KEY"), "{out}");
    assert_eq!(count("untouched"), 0);
}

//! Hostile requests, table-driven: each limit exceeded by one, each framing
//! error, bad numbers, bad UTF-8, deep nesting, empty and null everywhere.
//! Every case gets its exact answer, and afterwards the server still answers
//! and the stored data is unchanged.

use serde_json::json;

use crate::harness::{request_bytes, Server, KEY};

/// Small limits, so that "one past the limit" is cheap to send.
const FLAGS: &[&str] = &[
    "--head-bytes-max",
    "2048",
    "--headers-max",
    "16",
    "--body-bytes-max",
    "65536",
    "--chunks-max",
    "8",
    "--chunk-bytes-max",
    "1024",
    "--items-max",
    "10",
    "--metadata-entries-max",
    "4",
    "--metadata-bytes-max",
    "200",
    "--indexes-max",
    "1",
    "--index-name-bytes-max",
    "16",
    "--dimensions-max",
    "64",
    "--k-max",
    "50",
    "--filter-terms-max",
    "6",
    "--filter-depth-max",
    "2",
];

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    status: u16,
    code: &'static str,
    /// A part of `error.detail` (or, without a detail, of `error.description`).
    says: &'static str,
    closes: bool,
}

fn api(
    name: &'static str,
    method: &str,
    path: &str,
    body: Option<&str>,
    status: u16,
    code: &'static str,
    says: &'static str,
) -> Case {
    let bytes = request_bytes(method, path, &[("X-Service-API-Key", KEY)], body);
    Case { name, bytes, status, code, says, closes: false }
}

fn raw(name: &'static str, bytes: impl Into<Vec<u8>>, status: u16, code: &'static str, says: &'static str) -> Case {
    Case { name, bytes: bytes.into(), status, code, says, closes: true }
}

fn chunked(name: &'static str, chunks: &[&str], status: u16, code: &'static str, says: &'static str) -> Case {
    let mut text = format!(
        "PUT /api/v1/embeddings/base/upsert HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for chunk in chunks {
        text.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    text.push_str("0\r\n\r\n");
    Case {
        name,
        bytes: text.into_bytes(),
        status,
        code,
        says,
        closes: status != 200 && status < 500 && code != "INVALID_REQUEST_BODY",
    }
}

fn embeddings(items: &[String]) -> String {
    format!(r#"{{"embeddings":[{}]}}"#, items.join(","))
}

fn cases() -> Vec<Case> {
    const BAD: &str = "INVALID_REQUEST_BODY";
    const MALFORMED: &str = "MALFORMED_HTTP_REQUEST";
    const SKIPPED: &str = "EMBEDDINGS_SKIPPED";
    const SEARCH: &str = "SIMILARITY_SEARCH_ERROR";
    let upsert = "/api/v1/embeddings/base/upsert";
    let insert = "/api/v1/embeddings/base/insert";
    let search = "/api/v1/embeddings/base/search";
    let retrieve = "/api/v1/embeddings/base/retrieve";
    let delete = "/api/v1/embeddings/base/delete";
    let eleven_ids = format!(r#"{{"ids":[{}]}}"#, (100..111).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let eleven_items: Vec<String> = (100..111).map(|i| format!(r#"{{"id":{i},"data":[1,2,3]}}"#)).collect();
    let five_entries =
        r#"{"embeddings":[{"id":9,"data":[1,2,3],"metadata":{"a":"1","b":"2","c":"3","d":"4","e":"5"}}]}"#;
    let long_value = "v".repeat(200);
    let big_metadata = format!(r#"{{"embeddings":[{{"id":9,"data":[1,2,3],"metadata":{{"k":"{long_value}"}}}}]}}"#);
    // `{"k":["a",...]}` of 49 elements is 203 bytes of text.
    let elements = vec![r#""a""#; 49].join(",");
    let long_array = format!(r#"{{"embeddings":[{{"id":9,"data":[1,2,3],"metadata":{{"k":[{elements}]}}}}]}}"#);
    let deep = format!(r#"{{"ids":{}{}}}"#, "[".repeat(2000), "]".repeat(2000));
    // The object is level 1, `ids` level 2: 15 more arrays make 17 levels.
    let deep_17 = format!(r#"{{"ids":[{}{}]}}"#, "[".repeat(15), "]".repeat(15));
    let deep_16 = format!(r#"{{"ids":[{}{}]}}"#, "[".repeat(14), "]".repeat(14));
    let seventeen_headers: String = (0..17).map(|i| format!("X-H{i}: v\r\n")).collect();
    let head_2049 = {
        let prefix = "GET /api/v1/health HTTP/1.1\r\nX-Pad: ";
        let pad = 2049 - prefix.len() - 4;
        format!("{prefix}{}\r\n\r\n", "p".repeat(pad))
    };

    vec![
        // Limits, each exceeded by one.
        raw(
            "17 headers",
            format!("GET /api/v1/health HTTP/1.1\r\n{seventeen_headers}\r\n"),
            431,
            "HEADERS_TOO_LARGE",
            "too many header fields",
        ),
        raw("2049-byte head", head_2049, 431, "HEADERS_TOO_LARGE", "request head too large"),
        raw(
            "body of 65537 bytes",
            format!("PUT {upsert} HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nContent-Length: 65537\r\n\r\n"),
            413,
            "REQUEST_TOO_LARGE",
            "65536 bytes",
        ),
        chunked(
            "9 chunks",
            &["{", "\"", "e", "m", "b", "\"", ":", "[", "]}"],
            413,
            "REQUEST_TOO_LARGE",
            "too many chunks",
        ),
        chunked("a 1025-byte chunk", &[&" ".repeat(1025)], 413, "REQUEST_TOO_LARGE", "chunk"),
        api("11 ids to retrieve", "POST", retrieve, Some(&eleven_ids), 400, BAD, "ids: at most 10 per request"),
        api("11 ids to delete", "DELETE", delete, Some(&eleven_ids), 400, BAD, "ids: at most 10 per request"),
        api(
            "11 embeddings to upsert",
            "PUT",
            upsert,
            Some(&embeddings(&eleven_items)),
            400,
            BAD,
            "embeddings: at most 10 per request",
        ),
        api(
            "11 embeddings to insert",
            "PUT",
            insert,
            Some(&embeddings(&eleven_items)),
            400,
            BAD,
            "embeddings: at most 10 per request",
        ),
        api(
            "5 metadata entries",
            "PUT",
            upsert,
            Some(five_entries),
            400,
            BAD,
            "embeddings[0].metadata: at most 4 entries",
        ),
        api(
            "201 bytes of metadata",
            "PUT",
            upsert,
            Some(&big_metadata),
            400,
            BAD,
            "embeddings[0].metadata: at most 200 bytes",
        ),
        api(
            "65 dimensions",
            "PUT",
            "/api/v1/indexes/wide/create",
            Some(r#"{"dimensions":65,"metric":"l2"}"#),
            400,
            BAD,
            "dimensions: expected an integer from 1 to 64",
        ),
        api(
            "k of 51",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":51}"#),
            400,
            BAD,
            "k: expected an integer from 1 to 50",
        ),
        api(
            "a second index",
            "PUT",
            "/api/v1/indexes/second/create",
            Some(r#"{"dimensions":3,"metric":"l2"}"#),
            500,
            "INDEX_NOT_CREATED",
            "most indexes",
        ),
        api(
            "a 17-byte name",
            "PUT",
            "/api/v1/indexes/abcdefghijklmnopq/create",
            Some(r#"{"dimensions":3,"metric":"l2"}"#),
            500,
            "INDEX_NOT_CREATED",
            "3 to 16 characters",
        ),
        // Framing errors.
        raw("no HTTP version", "GET /api/v1/health\r\n\r\n", 400, MALFORMED, "invalid request line"),
        raw("HTTP/2.0", "GET /api/v1/health HTTP/2.0\r\n\r\n", 400, MALFORMED, "invalid request line"),
        raw("space in the path", "GET /api/v1/ health HTTP/1.1\r\n\r\n", 400, MALFORMED, "invalid request line"),
        raw(
            "header without a colon",
            "GET /api/v1/health HTTP/1.1\r\nNoColon\r\n\r\n",
            400,
            MALFORMED,
            "invalid request line or header",
        ),
        raw("NUL in a header", "GET /api/v1/health HTTP/1.1\r\nX: a\0b\r\n\r\n", 400, MALFORMED, "invalid"),
        raw(
            "two Content-Lengths that differ",
            format!("PUT {upsert} HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}"),
            400,
            MALFORMED,
            "conflicting Content-Length",
        ),
        raw(
            "Content-Length and chunked",
            format!("PUT {upsert} HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{{}}"),
            400,
            MALFORMED,
            "both Content-Length and Transfer-Encoding",
        ),
        raw(
            "chunked twice",
            format!("PUT {upsert} HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"),
            400,
            MALFORMED,
            "Transfer-Encoding",
        ),
        raw(
            "gzip transfer coding",
            format!("PUT {upsert} HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
            400,
            MALFORMED,
            "Transfer-Encoding",
        ),
        raw(
            "negative Content-Length",
            format!("PUT {upsert} HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
            400,
            MALFORMED,
            "invalid Content-Length",
        ),
        raw(
            "huge Content-Length",
            format!("PUT {upsert} HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            400,
            MALFORMED,
            "invalid Content-Length",
        ),
        raw(
            "Content-Length with a sign",
            format!("PUT {upsert} HTTP/1.1\r\nContent-Length: +5\r\n\r\n"),
            400,
            MALFORMED,
            "invalid Content-Length",
        ),
        raw(
            "hex chunk size that is not hex",
            format!("PUT {upsert} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n"),
            400,
            MALFORMED,
            "invalid chunk size",
        ),
        raw(
            "chunk without its CRLF",
            format!("PUT {upsert} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}XX0\r\n\r\n"),
            400,
            MALFORMED,
            "CRLF",
        ),
        raw(
            "chunk size of 2^64",
            format!("PUT {upsert} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n"),
            400,
            MALFORMED,
            "invalid chunk size",
        ),
        raw("TLS handshake", &b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n"[..], 400, MALFORMED, "invalid"),
        raw(
            "bytes that are not UTF-8 in the path",
            &b"GET /api/v1/indexes/\xff\xfe/stats HTTP/1.1\r\n\r\n"[..],
            400,
            MALFORMED,
            "invalid",
        ),
        // Bodies: not JSON, deep, empty, null.
        api("empty body", "POST", search, Some(""), 400, BAD, "empty body"),
        api("whitespace body", "POST", search, Some(" \n\t "), 400, BAD, "empty body"),
        api("null body", "POST", search, Some("null"), 400, BAD, "body: expected a JSON object"),
        api("array body", "POST", retrieve, Some("[1,2]"), 400, BAD, "body: expected a JSON object"),
        api("2000-deep nesting", "POST", retrieve, Some(&deep), 400, BAD, "body: invalid JSON"),
        api("17-deep nesting", "POST", retrieve, Some(&deep_17), 400, BAD, "body: invalid JSON"),
        api(
            "16-deep nesting is JSON, just not ids",
            "POST",
            retrieve,
            Some(&deep_16),
            400,
            BAD,
            "ids[0]: expected a 64-bit integer",
        ),
        api(
            "NaN",
            "POST",
            search,
            Some(r#"{"queryVector":[NaN,1,2],"k":1}"#),
            400,
            BAD,
            "body: NaN is not a JSON number (at byte 16)",
        ),
        api(
            "Infinity",
            "POST",
            search,
            Some(r#"{"queryVector":[Infinity,1,2],"k":1}"#),
            400,
            BAD,
            "body: Infinity is not a JSON number (at byte 16)",
        ),
        api(
            "float overflowing f64",
            "POST",
            search,
            Some(r#"{"queryVector":[1e999,1,2],"k":1}"#),
            400,
            BAD,
            "body: invalid JSON",
        ),
        api("trailing comma", "POST", retrieve, Some(r#"{"ids":[1,]}"#), 400, BAD, "body: invalid JSON"),
        {
            let body = b"{\"embeddings\":[{\"id\":9,\"data\":[1,2,3],\"metadata\":{\"k\":\"\xff\"}}]}";
            let head =
                format!("PUT {upsert} HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nContent-Length: {}\r\n\r\n", body.len());
            let bytes = [head.as_bytes(), &body[..]].concat();
            Case {
                name: "not UTF-8 in metadata",
                bytes,
                status: 400,
                code: BAD,
                says: "body: invalid JSON",
                closes: false,
            }
        },
        api("ids null", "POST", retrieve, Some(r#"{"ids":null}"#), 400, BAD, "ids: expected an array of integers"),
        api(
            "ids missing",
            "DELETE",
            delete,
            Some("{}"),
            400,
            BAD,
            "body: expected ids (an array of 64-bit integers) or filter",
        ),
        api("ids missing", "POST", retrieve, Some("{}"), 400, BAD, "ids: required"),
        api(
            "trailing text",
            "POST",
            retrieve,
            Some(r#"{"ids":[1]} {"ids":[2]}"#),
            400,
            BAD,
            "body: unexpected text at byte 12, after the end of the JSON value",
        ),
        api(
            "unknown field",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filters":{"a":"b"}}"#),
            400,
            BAD,
            "filters: unknown field (did you mean 'filter'?)",
        ),
        api(
            "embeddings null",
            "PUT",
            upsert,
            Some(r#"{"embeddings":null}"#),
            400,
            BAD,
            "embeddings: expected an array",
        ),
        api(
            "embedding null",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[null]}"#),
            400,
            BAD,
            "embeddings[0]: expected a JSON object",
        ),
        api(
            "id null",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":null,"data":[1,2,3]}]}"#),
            400,
            BAD,
            "embeddings[0].id",
        ),
        api(
            "data null",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":null}]}"#),
            400,
            BAD,
            "embeddings[0].data",
        ),
        api(
            "metadata value null",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[1,2,3],"metadata":{"k":null}}]}"#),
            400,
            BAD,
            "embeddings[0].metadata.k",
        ),
        api(
            "metadata value a nested object",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[1,2,3],"metadata":{"k":{"a":"b"}}}]}"#),
            400,
            BAD,
            "embeddings[0].metadata.k: expected a string, number, boolean or array of strings (objects do not nest)",
        ),
        api(
            "metadata array holding a number",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[1,2,3],"metadata":{"k":["a",2]}}]}"#),
            400,
            BAD,
            "embeddings[0].metadata.k[1]: expected a string",
        ),
        api(
            "metadata number beyond f64",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[1,2,3],"metadata":{"k":-1e309}}]}"#),
            400,
            BAD,
            "body: invalid JSON",
        ),
        api(
            "metadata array past the byte limit",
            "PUT",
            upsert,
            Some(&long_array),
            400,
            BAD,
            "embeddings[0].metadata: at most 200 bytes",
        ),
        api(
            "filter $contains of a number",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"tags":{"$contains":7}}}"#),
            400,
            BAD,
            "filter.tags.$contains: expected a string",
        ),
        api(
            "queryVector null",
            "POST",
            search,
            Some(r#"{"queryVector":null,"k":1}"#),
            400,
            BAD,
            "queryVector: expected an array",
        ),
        api("k null", "POST", search, Some(r#"{"queryVector":[1,2,3],"k":null}"#), 400, BAD, "k: expected an integer"),
        api(
            "include of an unknown value",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"include":["score","vector"]}"#),
            400,
            BAD,
            "include[1]: unknown value 'vector'",
        ),
        api(
            "include not an array",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"include":{"score":true}}"#),
            400,
            BAD,
            "include: expected an array",
        ),
        // Filters, scroll and delete by filter: one past each limit, and nulls.
        api(
            "filter one term past the limit",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"a":{"$in":["1","2","3","4","5","6"]}}}"#),
            400,
            BAD,
            "filter.a.$in: the filter has more than 6 terms",
        ),
        api(
            "filter one level past the limit",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"$not":{"$not":{"$not":{}}}}}"#),
            400,
            BAD,
            "filter.$not.$not.$not: filters nested deeper than 2 levels",
        ),
        api(
            "filter with a metadata key that starts with $",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"$lang":"en"}}"#),
            400,
            BAD,
            "filter: unknown operator '$lang'",
        ),
        api(
            "filter of an empty operator object",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"year":{}}}"#),
            400,
            BAD,
            "filter.year: expected at least one operator",
        ),
        api(
            "filter range of a string",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1,"filter":{"year":{"$gte":"2000"}}}"#),
            400,
            BAD,
            "filter.year.$gte: expected a number",
        ),
        api(
            "scroll limit past the maximum",
            "POST",
            "/api/v1/embeddings/base/scroll",
            Some(r#"{"limit":10001}"#),
            400,
            BAD,
            "limit: expected an integer from 1 to 10000",
        ),
        api(
            "scroll after beyond 64 bits",
            "POST",
            "/api/v1/embeddings/base/scroll",
            Some(r#"{"after":18446744073709551616}"#),
            400,
            BAD,
            "after: expected a 64-bit integer",
        ),
        api(
            "delete with ids and filter",
            "DELETE",
            delete,
            Some(r#"{"ids":[1],"filter":{"a":"b"}}"#),
            400,
            BAD,
            "body: expected either ids or filter, not both",
        ),
        api(
            "delete with a bad filter",
            "DELETE",
            delete,
            Some(r#"{"filter":{"$or":[]}}"#),
            400,
            BAD,
            "filter.$or: expected a non-empty array of filters",
        ),
        api(
            "search-batch with a bad filter",
            "POST",
            "/api/v1/embeddings/base/search-batch",
            Some(r#"{"searches":[{"queryVector":[1,2,3],"k":1,"filter":{"a":{"$in":"b"}}}]}"#),
            400,
            BAD,
            "searches[0].filter.a.$in: expected an array of strings, numbers or booleans",
        ),
        api(
            "dimensions null",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":null,"metric":"l2"}"#),
            400,
            BAD,
            "dimensions",
        ),
        api(
            "metric null",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":null}"#),
            400,
            BAD,
            "metric: expected a string",
        ),
        api(
            "metric empty",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":""}"#),
            500,
            "INVALID_SIMILARITY_METRIC",
            "metric '' is not supported",
        ),
        // lp's p: absent, zero, negative, a string, beyond f32, or too
        // small to be an f32 above 0. Nothing is created.
        api(
            "lp without p",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp"}"#),
            400,
            BAD,
            "p: the lp metric needs a number above 0 and finite",
        ),
        api(
            "lp p zero",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp","p":0}"#),
            400,
            BAD,
            "p: the lp metric needs",
        ),
        api(
            "lp p negative",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp","p":-2}"#),
            400,
            BAD,
            "p: the lp metric needs",
        ),
        api(
            "lp p a string",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp","p":"3"}"#),
            400,
            BAD,
            "p: the lp metric needs",
        ),
        api(
            "lp p beyond f32",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp","p":1e39}"#),
            400,
            BAD,
            "p: the lp metric needs",
        ),
        api(
            "lp p rounds to 0",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"lp","p":1e-46}"#),
            400,
            BAD,
            "p: the lp metric needs",
        ),
        api(
            "metric in another case",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":3,"metric":"L1"}"#),
            500,
            "INVALID_SIMILARITY_METRIC",
            "allowed values: cosine, l2, ip, l1, linf, lp, canberra, bc, js",
        ),
        // Numbers: negative, huge, fractional, at the i64 bounds.
        api(
            "k negative",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":-1}"#),
            400,
            BAD,
            "k: expected an integer from 1 to 50",
        ),
        api(
            "k zero",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":0}"#),
            400,
            BAD,
            "k: expected an integer from 1 to 50",
        ),
        api(
            "k fractional",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1.5}"#),
            400,
            BAD,
            "k: expected an integer",
        ),
        api(
            "k as 1e30",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2,3],"k":1e30}"#),
            400,
            BAD,
            "k: expected an integer",
        ),
        api(
            "dimensions negative",
            "PUT",
            "/api/v1/indexes/other/create",
            Some(r#"{"dimensions":-3,"metric":"l2"}"#),
            400,
            BAD,
            "dimensions: expected an integer from 1 to 64",
        ),
        api(
            "id one past i64::MAX",
            "POST",
            retrieve,
            Some(r#"{"ids":[9223372036854775808]}"#),
            400,
            BAD,
            "ids[0]: expected a 64-bit integer",
        ),
        api(
            "id at i64::MAX, absent",
            "POST",
            retrieve,
            Some(r#"{"ids":[9223372036854775807]}"#),
            500,
            SKIPPED,
            "9223372036854775807",
        ),
        api(
            "id at i64::MIN, absent",
            "DELETE",
            delete,
            Some(r#"{"ids":[-9223372036854775808]}"#),
            500,
            SKIPPED,
            "-9223372036854775808",
        ),
        api("id fractional", "POST", retrieve, Some(r#"{"ids":[1.5]}"#), 400, BAD, "ids[0]: expected a 64-bit integer"),
        api(
            "vector value overflowing f32",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[1e39,1,2]}]}"#),
            500,
            SKIPPED,
            "not a finite 32-bit float",
        ),
        api(
            "query value overflowing f32",
            "POST",
            search,
            Some(r#"{"queryVector":[-1e39,1,2],"k":1}"#),
            400,
            SEARCH,
            "not a finite 32-bit float",
        ),
        api(
            "query of the wrong length",
            "POST",
            search,
            Some(r#"{"queryVector":[1,2],"k":1}"#),
            400,
            SEARCH,
            "expected 3 dimensions, got 2",
        ),
        api(
            "vector of the wrong length",
            "PUT",
            upsert,
            Some(r#"{"embeddings":[{"id":9,"data":[]}]}"#),
            500,
            SKIPPED,
            "expected 3 dimensions, got 0",
        ),
        api(
            "existing id inserted again",
            "PUT",
            insert,
            Some(r#"{"embeddings":[{"id":1,"data":[9,9,9]}]}"#),
            500,
            SKIPPED,
            "already exists",
        ),
        // Auth before anything else.
        Case {
            name: "wrong key with a malformed body",
            bytes: request_bytes("PUT", upsert, &[("X-Service-API-Key", "nope")], Some("{{{")),
            status: 401,
            code: "INVALID_API_KEY",
            says: "does not hold",
            closes: false,
        },
        Case {
            name: "no key, oversized item list",
            bytes: request_bytes("POST", retrieve, &[], Some(&eleven_ids)),
            status: 401,
            code: "NO_API_KEY_PROVIDED",
            says: "missing",
            closes: false,
        },
    ]
}

#[test]
fn every_hostile_request_gets_its_exact_answer_and_changes_nothing() {
    let server = Server::start_with(FLAGS);
    let r = server.call("PUT", "/api/v1/indexes/base/create", Some(r#"{"dimensions":3,"metric":"l2"}"#));
    assert_eq!(r.status, 200);
    let seed = r#"{"embeddings":[{"id":1,"data":[1,2,3],"metadata":{"a":"b"}},{"id":2,"data":[4,5,6]},{"id":3,"data":[7,8,9]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/base/insert", Some(seed)).status, 200);
    let before = server.call("POST", "/api/v1/embeddings/base/retrieve", Some(r#"{"ids":[1,2,3]}"#)).body;

    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    for case in &cases {
        let mut client = server.connect();
        client.send(&case.bytes);
        let r = client.read_response();
        r.check_envelope();
        assert_eq!((r.status, r.code()), (case.status, case.code), "{}: {r:?}", case.name);
        let said =
            if r.detail().is_empty() { r.body["error"]["description"].to_string() } else { r.detail().to_owned() };
        assert!(said.contains(case.says), "{}: {said:?} does not say {:?}", case.name, case.says);
        if case.closes {
            assert!(client.is_closed(), "{}: the connection stayed open", case.name);
        }
    }

    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200);
    assert_eq!(server.call("GET", "/api/v1/indexes/list", None).body["data"]["indexes"], json!(["base"]));
    let after = server.call("POST", "/api/v1/embeddings/base/retrieve", Some(r#"{"ids":[1,2,3]}"#)).body;
    assert_eq!(after, before, "a hostile request changed stored data");
    assert_eq!(server.call("GET", "/api/v1/indexes/base/stats", None).body["data"]["count"], 3);
}

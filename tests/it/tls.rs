//! TLS (`--tls-cert`, `--tls-key`): a certificate made here, real TLS
//! clients (rustls, and OpenSSL through Python), every kind of request
//! and a snapshot download over it; plain HTTP on the port told to use
//! https; broken handshakes cut off alone; bad certificate files refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::Value;

use crate::harness::{read_frame, request_bytes, request_with_bytes, skip, Client, Rng, Server, KEY};

const WITH_KEY: &[(&str, &str)] = &[("X-Service-API-Key", KEY)];

/// A self-signed certificate for localhost and 127.0.0.1, written as PEM
/// files in a directory of its own.
struct Certificate {
    dir: tempfile::TempDir,
    der: CertificateDer<'static>,
}

impl Certificate {
    fn new() -> Certificate {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), signing_key.serialize_pem()).unwrap();
        Certificate { dir, der: cert.der().clone() }
    }

    fn cert_path(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn key_path(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    fn start(&self) -> Server {
        let (cert, key) = (self.cert_path(), self.key_path());
        Server::start_with(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()])
    }

    /// A client that trusts this certificate alone.
    fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }
}

/// A blocking HTTPS client (rustls), one connection.
struct TlsClient {
    stream: StreamOwned<ClientConnection, TcpStream>,
    buffered: Vec<u8>,
}

impl TlsClient {
    fn connect(server: &Server, config: Arc<ClientConfig>) -> TlsClient {
        let socket = TcpStream::connect(server.addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        socket.set_nodelay(true).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let session = ClientConnection::new(config, name).unwrap();
        TlsClient { stream: StreamOwned::new(session, socket), buffered: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
        self.stream.flush().unwrap();
    }

    fn call(&mut self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        self.send(&request_bytes(method, path, WITH_KEY, body));
        let (status, _, body) = self.read_frame();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Creates an l2 index `name` of the rows' dimensions and upserts them.
    fn fill(&mut self, name: &str, rows: &[Vec<f32>]) {
        let create = format!(r#"{{"dimensions":{},"metric":"l2"}}"#, rows[0].len());
        let (status, body) = self.call("PUT", &format!("/api/v1/indexes/{name}/create"), Some(&create));
        assert_eq!(status, 200, "{body}");
        let (status, body) = self.call("PUT", &format!("/api/v1/embeddings/{name}/upsert"), Some(&upsert_body(rows)));
        assert_eq!(status, 200, "{body}");
    }

    fn read_frame(&mut self) -> (u16, String, Vec<u8>) {
        read_frame(&mut self.stream, &mut self.buffered)
    }

    /// Whether the server ended the session cleanly (close_notify, then
    /// the end), with nothing more sent.
    fn ends_cleanly(&mut self) -> bool {
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).is_ok() && rest.is_empty() && self.buffered.is_empty()
    }
}

fn vectors(count: usize, dims: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(7);
    (0..count).map(|_| (0..dims).map(|_| rng.float()).collect()).collect()
}

/// A retrieve of ids 0 to `rows` - 1.
fn retrieve_all(rows: usize) -> String {
    let ids: Vec<usize> = (0..rows).collect();
    serde_json::json!({ "ids": ids }).to_string()
}

fn upsert_body(rows: &[Vec<f32>]) -> String {
    let items: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(id, vector)| serde_json::json!({"id": id, "data": vector, "metadata": {"n": id}}))
        .collect();
    serde_json::json!({ "embeddings": items }).to_string()
}

#[test]
fn every_kind_of_request_over_tls() {
    let certificate = Certificate::new();
    let server = certificate.start();
    assert!(server.log_line.contains(", HTTPS only,"), "{}", server.log_line);
    let mut client = TlsClient::connect(&server, certificate.client_config());

    let (status, body) = client.call("GET", "/healthz", None);
    assert_eq!((status, body["message"].as_str()), (200, Some("live")));
    let (status, body) =
        client.call("PUT", "/api/v1/indexes/tls-index/create", Some(r#"{"dimensions":48,"metric":"l2"}"#));
    assert_eq!(status, 200, "{body}");

    // A body of many records, and a reply of many.
    let rows = vectors(600, 48);
    let upsert = upsert_body(&rows);
    assert!(upsert.len() > 8 * 16_384, "{} bytes", upsert.len());
    let (status, body) = client.call("PUT", "/api/v1/embeddings/tls-index/upsert", Some(&upsert));
    assert_eq!(status, 200, "{body}");
    let retrieve = retrieve_all(rows.len());
    client.send(&request_bytes("POST", "/api/v1/embeddings/tls-index/retrieve", WITH_KEY, Some(&retrieve)));
    let (status, _, reply) = client.read_frame();
    assert!(reply.len() > 200_000, "{} bytes", reply.len());
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(status, 200);
    assert_eq!(reply["data"]["embeddings"].as_array().unwrap().len(), rows.len());

    // Searches pipelined in one write, each checked against brute force.
    let queries = &rows[..20];
    let mut pipelined = Vec::new();
    for query in queries {
        let body = serde_json::json!({ "queryVector": query, "k": 5 }).to_string();
        pipelined.extend(request_bytes("POST", "/api/v1/embeddings/tls-index/search", WITH_KEY, Some(&body)));
    }
    client.send(&pipelined);
    for query in queries {
        let (status, _, reply) = client.read_frame();
        assert_eq!(status, 200);
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        let mut got: Vec<(u64, u64)> = reply["data"]["nearest_neighbors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(id, hit)| (hit["rank"].as_u64().unwrap(), id.parse().unwrap()))
            .collect();
        got.sort_unstable();
        let got: Vec<u64> = got.into_iter().map(|(_, id)| id).collect();
        let mut oracle: Vec<(f64, u64)> = rows
            .iter()
            .enumerate()
            .map(|(id, row)| {
                let d: f64 = row.iter().zip(query).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
                (d, id as u64)
            })
            .collect();
        oracle.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let want: Vec<u64> = oracle[..5].iter().map(|&(_, id)| id).collect();
        assert_eq!(got, want);
    }

    // A client that sends its records as small as TLS lets them be (32
    // bytes, each with 22 of framing): charged by its framing, served all
    // the same.
    let mut small = (*certificate.client_config()).clone();
    small.max_fragment_size = Some(32);
    let mut tiny = TlsClient::connect(&server, Arc::new(small));
    let (status, body) = tiny.call("PUT", "/api/v1/embeddings/tls-index/upsert", Some(&upsert));
    assert_eq!(status, 200, "{body}");
    assert_eq!(client.call("GET", "/healthz", None).0, 200);

    // Connection: close ends the session cleanly.
    client.send(&request_bytes("GET", "/healthz", &[("Connection", "close")], None));
    assert_eq!(client.read_frame().0, 200);
    assert!(client.ends_cleanly(), "close_notify, then the end");
}

/// The download's child takes the session over: what the connection still
/// owed, then the image, in order and sealed, then the session's close.
#[test]
fn a_snapshot_download_over_tls_is_whole() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let config = certificate.client_config();
    let mut client = TlsClient::connect(&server, config.clone());
    let rows = vectors(5_000, 16);
    client.fill("tls-source", &rows);

    let mut pipelined = request_bytes("GET", "/healthz", &[], None);
    pipelined.extend(request_bytes("GET", "/api/v1/indexes/tls-source/snapshot", WITH_KEY, None));
    client.send(&pipelined);
    assert_eq!(client.read_frame().0, 200, "the health answer owed before the download");
    let (status, head, image) = client.read_frame();
    assert_eq!(status, 200, "{head}");
    assert!(image.len() > 5_000 * 16 * 4, "{} bytes", image.len());
    assert!(client.ends_cleanly(), "the child closes the session");

    let mut other = TlsClient::connect(&server, config);
    other.send(&request_with_bytes("PUT", "/api/v1/indexes/tls-copy/restore", WITH_KEY, Some(&image)));
    let (status, _, body) = other.read_frame();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let retrieve = retrieve_all(rows.len());
    let (_, source) = other.call("POST", "/api/v1/embeddings/tls-source/retrieve", Some(&retrieve));
    let (_, copy) = other.call("POST", "/api/v1/embeddings/tls-copy/retrieve", Some(&retrieve));
    assert_eq!(source["data"]["embeddings"].as_array().unwrap().len(), rows.len());
    assert_eq!(source["data"], copy["data"]);
}

/// A reply larger than the sockets hold, not read: part of it waits in the
/// session as records, the rest as plaintext, when a download is asked for
/// on the same connection. The child sends the records, then the rest,
/// then the image; the client reads them in order, then the session's end.
#[test]
fn a_download_behind_a_reply_not_yet_taken() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let mut client = TlsClient::connect(&server, certificate.client_config());
    let rows = vectors(30_000, 48);
    client.fill("tls-large", &rows);
    let retrieve = retrieve_all(rows.len());
    client.send(&request_bytes("POST", "/api/v1/embeddings/tls-large/retrieve", WITH_KEY, Some(&retrieve)));
    // The server writes until the sockets are full.
    std::thread::sleep(Duration::from_millis(500));
    client.send(&request_bytes("GET", "/api/v1/indexes/tls-large/snapshot", WITH_KEY, None));
    let (status, _, reply) = client.read_frame();
    assert_eq!(status, 200);
    assert!(reply.len() > 12_000_000, "a reply larger than the sockets hold: {} bytes", reply.len());
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["data"]["embeddings"].as_array().unwrap().len(), rows.len());
    let (status, head, image) = client.read_frame();
    assert_eq!(status, 200, "{head}");
    assert!(image.len() > rows.len() * 48 * 4, "{} bytes", image.len());
    assert!(client.ends_cleanly(), "the child closes the session");
}

/// A client's close_notify is answered with the server's; a handshake
/// that stalls is cut off like an idle connection.
#[test]
fn sessions_end_cleanly_and_stalled_handshakes_end() {
    let certificate = Certificate::new();
    let (cert, key) = (certificate.cert_path(), certificate.key_path());
    let server = Server::start_with(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--idle-timeout-ms",
        "300",
    ]);
    let config = certificate.client_config();
    let mut client = TlsClient::connect(&server, config.clone());
    assert_eq!(client.call("GET", "/healthz", None).0, 200);
    client.stream.conn.send_close_notify();
    client.stream.flush().unwrap();
    assert!(client.ends_cleanly(), "the server's close_notify, then the end");

    let mut hello = Vec::new();
    let mut session = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    session.write_tls(&mut hello).unwrap();
    let mut socket = TcpStream::connect(server.addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    socket.write_all(&hello[..hello.len() / 2]).unwrap();
    let started = std::time::Instant::now();
    let ended = socket.read(&mut [0u8; 64]);
    let reset = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionReset;
    assert!(matches!(ended, Ok(0)) || ended.as_ref().is_err_and(reset), "{ended:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "closed by the idle timeout, not the client's");
}

/// OpenSSL, through Python's standard library: a TLS stack that shares no
/// code with the server's.
#[test]
fn openssl_is_served_too() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let script = r#"
import http.client, json, ssl, sys
context = ssl.create_default_context(cafile=sys.argv[1])
connection = http.client.HTTPSConnection("localhost", int(sys.argv[2]), context=context, timeout=30)
for _ in range(3):
    connection.request("GET", "/api/v1/test-auth", headers={"X-Service-API-Key": sys.argv[3]})
    reply = connection.getresponse()
    print(reply.status, json.loads(reply.read())["message"], connection.sock.version())
"#;
    let port = server.addr.port().to_string();
    let output =
        match Command::new("python3").arg("-c").arg(script).arg(certificate.cert_path()).arg(&port).arg(KEY).output() {
            Ok(output) => output,
            Err(e) => return skip("openssl_is_served_too", &format!("no python3: {e}")),
        };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for line in lines {
        assert!(line.starts_with("200 ") && line.contains("TLSv1.3"), "{line}");
    }
}

#[test]
fn plain_http_on_the_tls_port_is_told_to_use_https() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let mut plain = Client::connect(server.addr);
    let response = plain.call("GET", "/api/v1/health", None);
    assert_eq!((response.status, response.code()), (400, "MALFORMED_HTTP_REQUEST"));
    assert!(response.detail().contains("https://") || response.body.to_string().contains("https://"), "{response:?}");
    assert!(plain.is_closed());
    let mut client = TlsClient::connect(&server, certificate.client_config());
    assert_eq!(client.call("GET", "/healthz", None).0, 200);
}

/// Bytes that are not TLS, a handshake cut short, a client that distrusts
/// the certificate, a record tampered with after the handshake: each ends
/// its own connection, and the server serves the next client.
#[test]
fn a_client_that_breaks_tls_is_cut_off_alone() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let config = certificate.client_config();
    let mut rng = Rng(11);

    let garbage: Vec<u8> = (0..300).map(|_| rng.next_u64() as u8).collect();
    // Each with whether the server's answer is a fatal alert: it is, where
    // the bytes made a record it could judge.
    let mut attempts: Vec<(Vec<u8>, bool)> = vec![
        // A handshake record: a ClientHello of four bytes of noise.
        (vec![0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef], true),
        // One whose body is noise: a message it waits for the rest of, cut off.
        ([&[0x16, 0x03, 0x01, 0x01, 0x00][..], &garbage[..256]].concat(), false),
        // A record header alone, then the end.
        (vec![0x16, 0x03, 0x01, 0x40, 0x00], false),
        // Noise from the first byte (not a letter, so not taken for HTTP).
        ([&[0x80][..], &garbage[..]].concat(), true),
        // An alert before any handshake.
        (vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28], false),
    ];
    // The start of a real ClientHello, cut in the middle.
    let mut hello = Vec::new();
    let mut session = ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap();
    session.write_tls(&mut hello).unwrap();
    hello.truncate(hello.len() / 2);
    attempts.push((hello, false));
    for (bytes, alert) in attempts {
        let mut socket = TcpStream::connect(server.addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        socket.write_all(&bytes).unwrap();
        let _ = socket.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        let _ = socket.read_to_end(&mut reply);
        assert!(!reply.starts_with(b"HTTP/"), "a TLS port answers TLS only: {reply:?}");
        // A fatal alert (type 21, level 2), or at most a close_notify.
        let fatal = reply.len() >= 6 && reply[0] == 0x15 && reply[5] == 2;
        assert_eq!(fatal, alert, "{bytes:?}: {reply:?}");
        assert_eq!(TlsClient::connect(&server, config.clone()).call("GET", "/healthz", None).0, 200);
    }

    // A client that trusts another certificate gives up in the handshake.
    let stranger = Certificate::new().client_config();
    let mut distrustful = TlsClient::connect(&server, stranger);
    assert!(distrustful.stream.write_all(&request_bytes("GET", "/healthz", &[], None)).is_err());

    // A record altered in flight: the session ends, with an alert.
    let mut client = TlsClient::connect(&server, config.clone());
    assert_eq!(client.call("GET", "/healthz", None).0, 200);
    let mut sealed = Vec::new();
    client.stream.conn.writer().write_all(&request_bytes("GET", "/healthz", &[], None)).unwrap();
    client.stream.conn.write_tls(&mut sealed).unwrap();
    let last = sealed.len() - 1;
    sealed[last] ^= 1;
    // More bytes behind it, unread when the server ends the session: the
    // alert must still arrive, not a reset.
    sealed.extend(std::iter::repeat_n(0x17, 64 * 1024));
    client.stream.sock.write_all(&sealed).unwrap();
    let error = client.stream.read_to_end(&mut Vec::new()).expect_err("an alert, not an answer");
    assert!(error.to_string().contains("alert"), "{error}");

    assert_eq!(TlsClient::connect(&server, config).call("GET", "/healthz", None).0, 200);
    assert!(server.log().contains("listening on"), "alive");
}

/// Bad certificate settings stop the start, naming the file and the fault.
#[test]
fn bad_certificate_settings_stop_the_start() {
    let certificate = Certificate::new();
    let (cert, key) = (certificate.cert_path(), certificate.key_path());
    let start = |args: &[&Path]| {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command.args(["--host", "127.0.0.1", "--port", "0", "--api-key", KEY, "--data-dir"]).arg(dir.path());
        for pair in args.chunks(2) {
            command.arg(pair[0]).arg(pair[1]);
        }
        let output = command.output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let flag = |name: &'static str| Path::new(name);

    let (code, said) = start(&[flag("--tls-cert"), &cert]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("--tls-key"), "{said}");

    let other = Certificate::new();
    let not_pem = certificate.dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let missing = certificate.dir.path().join("missing.pem");
    let cases: [(&Path, &Path, &str); 4] = [
        (&missing, &key, "cannot read the TLS certificate"),
        (&not_pem, &key, "holds no CERTIFICATE"),
        (&cert, &not_pem, "holds no PEM private key"),
        (&cert, &other.key_path(), "cannot be used together"),
    ];
    for (cert, key, why) in cases {
        let (code, said) = start(&[flag("--tls-cert"), cert, flag("--tls-key"), key]);
        assert_eq!(code, Some(1), "{said}");
        assert!(said.contains(why), "{why}: {said}");
        assert!(!said.contains("listening on"), "{said}");
    }
}

/// `quiver import` and `export` speak https, trusting the certificate
/// `--ca-cert` names (and, without it, refusing one nobody vouches for).
#[test]
fn import_and_export_over_tls() {
    let certificate = Certificate::new();
    let server = certificate.start();
    let mut client = TlsClient::connect(&server, certificate.client_config());
    assert_eq!(
        client.call("PUT", "/api/v1/indexes/tls-files/create", Some(r#"{"dimensions":4,"metric":"ip"}"#)).0,
        200
    );
    let dir = tempfile::tempdir().unwrap();
    let rows = vectors(250, 4);
    let lines: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(id, vector)| serde_json::json!({"id": id, "data": vector, "metadata": {"n": id}}).to_string())
        .collect();
    let source = dir.path().join("in.jsonl");
    std::fs::write(&source, lines.join("\n") + "\n").unwrap();
    let url = format!("https://localhost:{}", server.addr.port());
    let tool = |which: &str, file: &Path, ca_cert: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command.args([which, "--url", &url, "--index", "tls-files", "--api-key", KEY]);
        if let Some(path) = ca_cert {
            command.arg("--ca-cert").arg(path);
        }
        let output = command.arg(file).output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };

    let (code, said) = tool("import", &source, None);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.to_lowercase().contains("certificate"), "{said}");
    let (code, said) = tool("import", &source, Some(&certificate.cert_path()));
    assert_eq!(code, Some(0), "{said}");

    let exported = dir.path().join("out.jsonl");
    let (code, said) = tool("export", &exported, Some(&certificate.cert_path()));
    assert_eq!(code, Some(0), "{said}");
    let text = std::fs::read_to_string(&exported).unwrap();
    let mut back: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    back.sort_by_key(|row| row["id"].as_u64());
    assert_eq!(back.len(), rows.len());
    for (row, want) in back.iter().zip(&rows) {
        let got: Vec<f32> = row["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(&got, want);
    }
}

//! The process: the API key's sources and file, the start-up log, `--help`,
//! and a clean shutdown on SIGTERM.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::harness::{request_bytes, start_fails, Server};

fn key_file(server: &Server) -> (String, u32) {
    let path = server.data_dir().join("api_key.txt");
    let key = std::fs::read_to_string(&path).unwrap().trim().to_owned();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    (key, mode)
}

fn status_with_key(server: &Server, key: &str) -> u16 {
    server.connect().call_with("GET", "/api/v1/indexes/list", &[("X-Service-API-Key", key)], None).status
}

/// The start that generates a key prints it whole, once, on a line of its
/// own with the key file's path (the operator reads it in the container's
/// log); every later start shows only its first characters, its length and
/// where it came from.
#[test]
fn a_generated_key_is_printed_once_kept_0600_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start_in(None, data_dir.clone(), &[], &[]);
    let (key, mode) = key_file(&server);
    assert!(key.len() >= 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    assert_eq!(mode, 0o600);
    let log = server.log();
    assert_eq!(log.matches(&key[..8]).count(), 1, "the key once: {log}");
    let key_path = data_dir.join("api_key.txt").display().to_string();
    let printed = log.lines().find(|line| line.contains(&key)).expect("the whole key is printed");
    assert!(printed.ends_with(&format!(": {key}")), "the key ends its line: {printed}");
    assert!(printed.contains(&key_path), "the key's line names the key file: {printed}");
    assert!(!printed.contains("listening on"), "the key has a line of its own: {printed}");
    let fingerprint = format!("API key {}… ({} characters) (newly generated", &key[..4], key.len());
    assert!(server.log_line.contains(&fingerprint), "the start-up line shows a fingerprint: {}", server.log_line);
    assert!(server.log_line.contains(&key_path), "the start-up line names the key file: {}", server.log_line);
    assert_eq!(status_with_key(&server, &key), 200);
    drop(server);

    // A restart on the same directory keeps the key, and does not print it.
    let server = Server::start_in(None, data_dir, &[], &[]);
    assert_eq!(key_file(&server).0, key);
    assert_eq!(status_with_key(&server, &key), 200);
    let log = server.log();
    assert!(!log.contains(&key[..8]), "a key read from its file is not printed again: {log}");
    let fingerprint = format!("API key {}… ({} characters) (from the key file", &key[..4], key.len());
    assert!(server.log_line.contains(&fingerprint), "{}", server.log_line);
}

/// A key the operator chose, by flag or environment, is never echoed.
#[test]
fn a_given_key_is_never_printed() {
    let key = "a-secret-the-operator-chose-0123456789";
    for (args, env) in [(&["--api-key", key][..], &[][..]), (&[][..], &[("QUIVER_API_KEY", key)][..])] {
        let server = Server::start_raw(args, env);
        assert_eq!(status_with_key(&server, key), 200);
        let log = server.log();
        assert!(!log.contains("a-secret") && !log.contains("newly generated"), "{log}");
        assert!(server.log_line.contains("API key a-se… (38 characters) (from --api-key or QUIVER_API_KEY"), "{log}");
    }
}

#[test]
fn flag_beats_environment_beats_file() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::write(data_dir.join("api_key.txt"), "from-file\n").unwrap();

    let server = Server::start_in(None, data_dir.clone(), &[], &[]);
    assert_eq!(status_with_key(&server, "from-file"), 200);
    drop(server);

    let server = Server::start_in(None, data_dir.clone(), &[], &[("QUIVER_API_KEY", "from-env")]);
    assert_eq!(status_with_key(&server, "from-env"), 200);
    assert_eq!(status_with_key(&server, "from-file"), 401);
    assert_eq!(key_file(&server), ("from-env".to_owned(), 0o600), "the key in use is written to the file");
    drop(server);

    let server = Server::start_in(None, data_dir, &["--api-key", "from-flag"], &[("QUIVER_API_KEY", "from-env")]);
    assert_eq!(status_with_key(&server, "from-flag"), 200);
    assert_eq!(status_with_key(&server, "from-env"), 401);
}

#[test]
fn help_lists_every_flag_with_its_default() {
    let output = Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--host",
        "--port",
        "--data-dir",
        "--api-key",
        "--body-bytes-max",
        "--head-bytes-max",
        "--connections-max",
        "--idle-timeout-ms",
        "--request-timeout-ms",
        "--dimensions-max",
        "--k-max",
        "--snapshot-log-bytes",
        "--repair-log",
        "--unsafe-no-sync",
        "--metrics-public",
        "--log-level",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    for default in ["0.0.0.0", "8080", "./data", "268435456", "16384", "10000", "65536"] {
        assert!(help.contains(&format!("[default: {default}]")), "default {default} missing from --help");
    }
}

#[test]
fn sigterm_answers_what_is_in_flight_and_exits_0() {
    let server = Server::start();
    let mut client = server.connect();
    // A request whose body is still arriving when the signal comes.
    let request = request_bytes(
        "PUT",
        "/api/v1/indexes/late/create",
        &[("X-Service-API-Key", crate::harness::KEY)],
        Some(r#"{"dimensions":2,"metric":"l2"}"#),
    );
    let (first, rest) = request.split_at(request.len() - 5);
    client.send(first);
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: signals our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    client.send(rest);
    let r = client.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    let status = server.terminate();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_busy_port_is_a_clear_start_up_error() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    assert!(start_fails(dir.path(), &port, &[]).contains("cannot listen on"));
}

#[test]
fn limits_past_what_the_log_can_record_are_refused_at_start() {
    // A log record stores lengths as u32: these would let a client's request panic the server.
    for (flag, value) in [("--body-bytes-max", "2000000000"), ("--dimensions-max", "2000000")] {
        let output = Command::new(env!("CARGO_BIN_EXE_quiver")).args([flag, value]).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(flag) && message.contains("not in"), "{message}");
    }
}

/// A reply limit below the floor would refuse replies that name no
/// embedding at all (health, lists, errors): refused at start.
#[test]
fn a_reply_limit_below_its_floor_is_refused_at_start() {
    for value in ["65535", "0"] {
        let output = Command::new(env!("CARGO_BIN_EXE_quiver")).args(["--reply-bytes-max", value]).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "--reply-bytes-max {value}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains("--reply-bytes-max") && message.contains("not in"), "{message}");
    }
}

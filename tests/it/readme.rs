//! The README's curl examples, run as written against a real server.

use std::process::Command;

use crate::harness::Server;

/// The commands of the README's first `sh` block after "Using it with curl",
/// with continuation lines (and quoted arguments spanning lines) joined,
/// each with the reply shown after it (a `# => ` line), if any.
fn readme_commands() -> Vec<(String, Option<String>)> {
    let readme = include_str!("../../README.md");
    let section = readme.split("## Using it with curl").nth(1).expect("the curl section");
    let block = section.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    let mut commands: Vec<(String, Option<String>)> = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim();
        if let Some(reply) = line.strip_prefix("# => ") {
            let last = commands.last_mut().expect("a reply follows its command");
            assert!(last.1.is_none(), "one reply per command: {}", last.0);
            last.1 = Some(reply.to_owned());
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                // A single-quoted argument may go on over several lines.
                if current.matches('\'').count() % 2 == 1 {
                    current.push(' ');
                    continue;
                }
                commands.push((std::mem::take(&mut current), None));
            }
        }
    }
    commands
}

/// Every example runs as written and prints exactly the reply the README
/// shows after it (health, whose figures change, answers 200).
#[test]
fn every_curl_example_prints_what_the_readme_shows() {
    let dir = tempfile::tempdir().unwrap();
    // The examples read the key from `data/api_key.txt` relative to where they run.
    let server = Server::start_in(None, dir.path().join("data"), &[], &[]);
    let commands = readme_commands();
    let (setup, calls): (Vec<_>, Vec<_>) = commands.iter().partition(|(c, _)| !c.starts_with("curl"));
    assert_eq!(setup.len(), 2, "{setup:?}");
    assert_eq!(calls.len(), 16, "one example per endpoint, search with include, a filter and a typo");
    let prelude =
        setup.iter().map(|(c, _)| c.replace("127.0.0.1:8080", &server.addr.to_string())).collect::<Vec<_>>().join("; ");
    for (call, shown) in calls {
        let output = Command::new("bash")
            .arg("-c")
            .arg(format!("{prelude}; {call}"))
            .current_dir(dir.path())
            .output()
            .expect("bash and curl");
        let reply: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{call}: {e}: {}", String::from_utf8_lossy(&output.stdout)));
        match shown {
            Some(shown) => {
                let shown: serde_json::Value =
                    serde_json::from_str(shown).unwrap_or_else(|e| panic!("{call}: the README's reply: {e}"));
                assert_eq!(reply, shown, "{call}: the README shows another reply");
            }
            None => {
                assert!(call.ends_with("/health"), "{call}: the README shows no reply");
                assert_eq!(reply["status"], 200, "{call}: {reply}");
            }
        }
    }
}

/// The reference in `docs/` and the README stand on their own: every path
/// and error code of `openapi.yaml` and every flag of `--help` is in the
/// reference or the README, and neither sends the reader outside the
/// repository.
#[test]
fn the_reference_covers_every_path_code_and_flag() {
    let reference = include_str!("../../docs/reference.md");
    let readme = include_str!("../../README.md");
    let yaml = include_str!("../../openapi.yaml");
    let spec: serde_json::Value = yaml_serde::from_str(yaml).unwrap();
    for path in spec["paths"].as_object().unwrap().keys() {
        let path = path.replace("{indexName}", "{name}");
        assert!(reference.contains(&path), "docs/reference.md does not describe {path}");
    }
    for code in spec["components"]["schemas"]["ErrorCode"]["enum"].as_array().unwrap() {
        let code = format!("`{}`", code.as_str().unwrap());
        assert!(reference.contains(&code), "docs/reference.md does not list {code}");
    }
    let help = Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for flag in help.split_whitespace().filter(|word| word.starts_with("--") && word.len() > 2) {
        let flag = flag.trim_end_matches(',');
        if flag == "--help" || flag == "--version" {
            continue;
        }
        assert!(readme.contains(flag) || reference.contains(flag), "neither README nor reference explains {flag}");
    }
    for text in [reference, readme] {
        assert!(!text.contains("shared/"), "a link outside the repository");
    }
}

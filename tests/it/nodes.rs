//! Several real nodes of one cluster on loopback, for the cluster tests
//! and benchmarks: started, killed, restarted, asked who leads.
//!
//! Each node's HTTP port is on 127.0.0.1; its peer port on its own address,
//! 127.0.0.1, .2 and .3, so that firewall rules can tell the nodes apart.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Response, Server, KEY};

pub const SECRET: &str = "cluster-test-secret";

/// A free port on `ip` (bound and let go: the node binds it a moment later).
pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

pub struct Cluster {
    dir: tempfile::TempDir,
    pub peers: Vec<SocketAddr>,
    nodes: Vec<Option<Server>>,
    /// What the nodes killed so far had logged.
    past_logs: String,
    /// Whether a kill loses what a power loss would (the log's seam).
    power_loss: bool,
    /// Flags every node is started with besides the cluster's.
    args: Vec<String>,
    /// How many nodes started the group (the others were added later).
    first: usize,
}

impl Cluster {
    /// Starts `n` nodes (n <= 3, each on its own loopback address); with
    /// `power_loss`, a kill loses what a power loss would (the log's seam).
    pub fn start(n: usize, power_loss: bool) -> Cluster {
        Cluster::start_with(n, power_loss, &[])
    }

    /// `start`, every node also given `args`.
    pub fn start_with(n: usize, power_loss: bool, args: &[&str]) -> Cluster {
        let peers =
            (1..=n).map(|i| format!("127.0.0.{i}:{}", free_port(&format!("127.0.0.{i}"))).parse().unwrap()).collect();
        let nodes = (0..n).map(|_| None).collect();
        let args = args.iter().map(|arg| arg.to_string()).collect();
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            peers,
            nodes,
            past_logs: String::new(),
            power_loss,
            args,
            first: n,
        };
        for i in 0..n {
            cluster.start_node(i);
        }
        cluster
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{}", i + 1))
    }

    fn initial_peers(&self) -> String {
        self.peers
            .iter()
            .take(self.first)
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts one more node (its peer port on 127.0.0.<n>), with an empty
    /// data directory and no `--initial-peers`: it waits to be added.
    /// Returns its number (its id is one more).
    pub fn start_joining(&mut self) -> usize {
        let i = self.nodes.len();
        let ip = format!("127.0.0.{}", i + 1);
        self.peers.push(format!("{ip}:{}", free_port(&ip)).parse().unwrap());
        self.nodes.push(None);
        let (id, peer) = ((i + 1).to_string(), self.peers[i].to_string());
        let mut args = vec!["--api-key", KEY, "--node-id", &id, "--peer-addr", &peer];
        args.extend(self.args.iter().map(String::as_str));
        let server = Server::start_in(None, self.data_dir(i), &args, &[("QUIVER_CLUSTER_SECRET", SECRET)]);
        self.nodes[i] = Some(server);
        i
    }

    pub fn start_node(&mut self, i: usize) {
        let (id, peer, initial) = ((i + 1).to_string(), self.peers[i].to_string(), self.initial_peers());
        let mut args = vec!["--api-key", KEY, "--node-id", &id, "--peer-addr", &peer, "--initial-peers", &initial];
        args.extend(self.args.iter().map(String::as_str));
        let mut env = vec![("QUIVER_CLUSTER_SECRET", SECRET)];
        if self.power_loss {
            env.push(("QUIVER_FAULT_POWER_LOSS", "1"));
        }
        let server = Server::start_in(None, self.data_dir(i), &args, &env);
        self.nodes[i] = Some(server);
    }

    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("a running node")
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(server) = self.nodes[i].take() {
            self.past_logs.push_str(&server.log());
            server.kill();
        }
    }

    /// Every line any node has logged, those killed since the start first.
    fn logs(&self) -> String {
        let now: String = self.nodes.iter().flatten().map(Server::log).collect();
        // A line apart, so that a log cut short joins no line of the next.
        format!("{}\n{now}", self.past_logs)
    }

    /// Every line any node has logged that contains `text`.
    pub fn count_in_logs(&self, text: &str) -> usize {
        self.logs().lines().filter(|line| line.contains(text)).count()
    }

    /// Waits until the nodes have logged at least `count` lines that
    /// contain `text`, within `timeout` (else fails, saying `what`, with the
    /// logs). A node writes a line before the reply or the closing that
    /// follows it, but the harness drains its log through a pipe a thread
    /// reads: on a busy machine the lines may trail what a test has seen.
    pub fn wait_for_in_logs(&self, text: &str, count: usize, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        while self.count_in_logs(text) < count {
            if Instant::now() >= deadline {
                panic!("{what}: fewer than {count} lines with {text:?} within {timeout:?}:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self, i: usize) -> i32 {
        self.node(i).child.id() as i32
    }

    pub fn status(&self, i: usize) -> Option<Value> {
        let server = self.nodes[i].as_ref()?;
        let stream = std::net::TcpStream::connect_timeout(&server.addr, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        drop(stream);
        let r = server.call("GET", "/api/v1/cluster", None);
        (r.status == 200).then(|| r.body["data"].clone())
    }

    /// The node that leads with the others' agreement, within `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let statuses: Vec<Option<Value>> = (0..self.nodes.len()).map(|i| self.status(i)).collect();
            for (i, status) in statuses.iter().enumerate() {
                let Some(status) = status else { continue };
                let leads = status["role"] == "leader";
                let agreed = statuses.iter().flatten().filter(|s| s["leader_id"] == (i + 1) as u64).count();
                if leads && agreed * 2 > self.nodes.len() {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}: {statuses:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every running node has applied the same commit index.
    pub fn wait_until_converged(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let running = (0..self.nodes.len()).filter(|&i| self.is_running(i)).count();
            let statuses: Vec<Value> = (0..self.nodes.len()).filter_map(|i| self.status(i)).collect();
            let applied: BTreeSet<u64> = statuses.iter().map(|s| s["applied_index"].as_u64().unwrap()).collect();
            let committed: BTreeSet<u64> = statuses.iter().map(|s| s["commit_index"].as_u64().unwrap()).collect();
            if statuses.len() == running && applied.len() == 1 && applied == committed {
                return;
            }
            assert!(Instant::now() < deadline, "the nodes did not converge: {statuses:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A request, with the test key, on a fresh connection to `addr`; `None`
/// if the node is down or cut the connection before answering whole.
pub fn try_call(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Option<Response> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let headers = [("X-Service-API-Key", KEY), ("Connection", "close")];
    stream.write_all(&crate::harness::request_bytes(method, path, &headers, body)).ok()?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let length: usize = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")))?
        .1
        .trim()
        .parse()
        .ok()?;
    if body.len() != length {
        return None;
    }
    let status = head.get(9..12)?.parse().ok()?;
    Some(Response { status, head: head.to_owned(), body: serde_json::from_str(body).ok()? })
}

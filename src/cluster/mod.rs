//! Replication: several nodes, one database, every write through one Raft
//! log, driven by `raft` (tikv/raft-rs). Without the cluster flags nothing
//! here runs, and a node is the single node it always was.
//!
//! - `log`: the Raft log on disk (entries, hard state, configuration), in
//!   the write-ahead log's segments and framing; `raft::Storage` over it.
//! - `node`: one member of the group, and the order a `Ready` is carried out in.
//! - `peers`: the links to the other nodes, proven by the cluster secret.
//! - `replica`: this node's turn: messages in, the clock, read rounds,
//!   `Node::advance`, messages out. What the entries mean is the api's
//!   (`api::replicated`).

pub mod log;
pub mod node;
pub mod peers;
pub mod replica;

//! Replication: several nodes, one database, every write through one Raft
//! log, driven by `raft` (tikv/raft-rs). Without the cluster flags nothing
//! here runs, and a node is the single node it always was.
//!
//! - `log`: the Raft log on disk (entries, hard state, configuration), in
//!   the write-ahead log's segments and framing; `raft::Storage` over it.

pub mod log;
pub mod node;

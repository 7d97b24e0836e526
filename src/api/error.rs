//! Every way a request can fail, each mapped to exactly one envelope
//! (status, error.code, message, description).

use std::fmt;

use super::envelope::Envelope;
use crate::db::StorageError;
use crate::http::HttpError;
use crate::store::Metric;

/// Which operation failed to find its index (the envelope code differs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOp {
    Fetch,
    Delete,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ApiError {
    /// The body is not what the endpoint takes; `detail` says exactly what is wrong.
    BadBody {
        detail: String,
    },
    /// `header` names the header the key was looked for in, or came in.
    NoApiKey {
        header: &'static str,
    },
    InvalidApiKey {
        header: &'static str,
    },
    /// A request the read-only key may not make: `what` is its route label.
    ReadOnlyKey {
        what: &'static str,
    },
    /// A snapshot download could not start: `reason` says why.
    SnapshotUnavailable {
        reason: String,
    },
    /// `GET /readyz` before this node can serve: `reason` says why.
    NotReady {
        reason: String,
    },
    NotFound {
        path: String,
    },
    MethodNotAllowed {
        path: String,
        allow: &'static str,
    },
    IndexNotFound {
        name: String,
        op: IndexOp,
    },
    IndexNameInvalid {
        name: String,
        bytes_max: usize,
    },
    TooManyIndexes {
        max: usize,
    },
    IndexExists {
        name: String,
    },
    InvalidMetric {
        metric: String,
    },
    SearchFailed {
        reason: String,
    },
    /// The reply would exceed `--reply-bytes-max`: about `bytes`, of which
    /// `fit` items (ids, or hits) would fit; `what` names them.
    ReplyTooLarge {
        bytes: usize,
        max: usize,
        fit: usize,
        what: &'static str,
    },
    Http {
        error: HttpError,
        body_bytes_max: usize,
    },
    Timeout,
    TooManyConnections,
    Storage(StorageError),
    /// A cluster could not commit a write, or confirm a read, in time:
    /// `reason` says why, and for a write that it may still take effect.
    ClusterUnavailable {
        reason: String,
    },
    /// `?consistency=` with a value other than `linearizable` or `local`.
    BadConsistency {
        value: String,
    },
    /// A change of members asked of a single node.
    NotACluster,
    /// A node added under an id a member has, with another address.
    MemberExists {
        id: u64,
        address: String,
    },
    MemberNotFound {
        id: String,
    },
    /// The removal of the only voter.
    LastVoter {
        id: u64,
    },
}

impl ApiError {
    pub fn bad_body(detail: impl fmt::Display) -> ApiError {
        ApiError::BadBody { detail: detail.to_string() }
    }

    pub fn status(&self) -> u16 {
        match self {
            ApiError::BadBody { .. }
            | ApiError::SearchFailed { .. }
            | ApiError::ReplyTooLarge { .. }
            | ApiError::BadConsistency { .. }
            | ApiError::NotACluster => 400,
            ApiError::MemberNotFound { .. } => 404,
            ApiError::MemberExists { .. } | ApiError::LastVoter { .. } => 409,
            ApiError::NoApiKey { .. } | ApiError::InvalidApiKey { .. } => 401,
            ApiError::ReadOnlyKey { .. } => 403,
            ApiError::NotReady { .. } | ApiError::SnapshotUnavailable { .. } => 503,
            ApiError::NotFound { .. } => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::IndexNotFound { .. }
            | ApiError::IndexNameInvalid { .. }
            | ApiError::TooManyIndexes { .. }
            | ApiError::IndexExists { .. }
            | ApiError::InvalidMetric { .. } => 500,
            ApiError::Http { error: HttpError::Malformed(_), .. } => 400,
            ApiError::Http {
                error: HttpError::BodyTooLarge | HttpError::TooManyChunks | HttpError::ChunkTooLarge,
                ..
            } => 413,
            ApiError::Http { error: HttpError::HeadTooLarge | HttpError::TooManyHeaders, .. } => 431,
            ApiError::Timeout => 408,
            ApiError::TooManyConnections => 503,
            ApiError::Storage(StorageError::Failed(_)) => 500,
            ApiError::Storage(StorageError::ReadOnly(_)) => 503,
            ApiError::ClusterUnavailable { .. } => 503,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadBody { .. } => "INVALID_REQUEST_BODY",
            ApiError::NoApiKey { .. } => "NO_API_KEY_PROVIDED",
            ApiError::InvalidApiKey { .. } => "INVALID_API_KEY",
            ApiError::ReadOnlyKey { .. } => "READ_ONLY_API_KEY",
            ApiError::NotReady { .. } => "NOT_READY",
            ApiError::SnapshotUnavailable { .. } => "SNAPSHOT_UNAVAILABLE",
            ApiError::NotFound { .. } => "NOT_FOUND",
            ApiError::MethodNotAllowed { .. } => "METHOD_NOT_ALLOWED",
            ApiError::IndexNotFound { op: IndexOp::Fetch, .. } => "INDEX_NOT_FETCHED",
            ApiError::IndexNotFound { op: IndexOp::Delete, .. } => "INDEX_NOT_DELETED",
            ApiError::IndexNameInvalid { .. } | ApiError::IndexExists { .. } | ApiError::TooManyIndexes { .. } => {
                "INDEX_NOT_CREATED"
            }
            ApiError::InvalidMetric { .. } => "INVALID_SIMILARITY_METRIC",
            ApiError::SearchFailed { .. } => "SIMILARITY_SEARCH_ERROR",
            ApiError::ReplyTooLarge { .. } => "REPLY_TOO_LARGE",
            ApiError::Http { error: HttpError::Malformed(_), .. } => "MALFORMED_HTTP_REQUEST",
            ApiError::Http {
                error: HttpError::BodyTooLarge | HttpError::TooManyChunks | HttpError::ChunkTooLarge,
                ..
            } => "REQUEST_TOO_LARGE",
            ApiError::Http { error: HttpError::HeadTooLarge | HttpError::TooManyHeaders, .. } => "HEADERS_TOO_LARGE",
            ApiError::Timeout => "REQUEST_TIMEOUT",
            ApiError::TooManyConnections => "TOO_MANY_CONNECTIONS",
            ApiError::Storage(StorageError::Failed(_)) => "STORAGE_ERROR",
            ApiError::Storage(StorageError::ReadOnly(_)) => "READ_ONLY",
            ApiError::ClusterUnavailable { .. } => "CLUSTER_UNAVAILABLE",
            ApiError::BadConsistency { .. } => "INVALID_CONSISTENCY",
            ApiError::NotACluster => "NOT_A_CLUSTER",
            ApiError::MemberExists { .. } => "MEMBER_EXISTS",
            ApiError::MemberNotFound { .. } => "MEMBER_NOT_FOUND",
            ApiError::LastVoter { .. } => "LAST_VOTER",
        }
    }

    fn message(&self) -> &'static str {
        match self {
            ApiError::BadBody { .. } | ApiError::Http { error: HttpError::Malformed(_), .. } => "Bad request",
            ApiError::NoApiKey { .. } => "No API key provided.",
            ApiError::InvalidApiKey { .. } => "Invalid API key.",
            ApiError::ReadOnlyKey { .. } => "Forbidden",
            ApiError::NotReady { .. } => "not ready",
            ApiError::SnapshotUnavailable { .. } => "Service unavailable",
            ApiError::NotFound { .. } => "Not found",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::IndexNotFound { op: IndexOp::Fetch, .. } => "An error occurred while fetching the index.",
            ApiError::IndexNotFound { op: IndexOp::Delete, .. } => "An error occurred while deleting the index.",
            ApiError::IndexNameInvalid { .. }
            | ApiError::IndexExists { .. }
            | ApiError::InvalidMetric { .. }
            | ApiError::TooManyIndexes { .. } => "An error occurred while creating the index.",
            ApiError::SearchFailed { .. } => "An error occurred during the similarity search.",
            ApiError::ReplyTooLarge { .. } => "Reply too large",
            ApiError::Http {
                error: HttpError::BodyTooLarge | HttpError::TooManyChunks | HttpError::ChunkTooLarge,
                ..
            } => "Request too large",
            ApiError::Http { error: HttpError::HeadTooLarge | HttpError::TooManyHeaders, .. } => {
                "Request header fields too large"
            }
            ApiError::Timeout => "Request timeout",
            ApiError::TooManyConnections => "Service unavailable",
            ApiError::Storage(StorageError::Failed(_)) => "An error occurred while writing to disk.",
            ApiError::Storage(StorageError::ReadOnly(_)) => "Writes are refused until the server is restarted.",
            ApiError::ClusterUnavailable { .. } => "The cluster is unavailable.",
            ApiError::BadConsistency { .. } | ApiError::NotACluster => "Bad request",
            ApiError::MemberExists { .. } | ApiError::LastVoter { .. } => "Conflict",
            ApiError::MemberNotFound { .. } => "Not found",
        }
    }

    /// Whether the connection must close after this answer (the request's
    /// bytes can no longer be trusted to frame the next one).
    pub fn closes_connection(&self) -> bool {
        matches!(self, ApiError::Http { .. } | ApiError::Timeout | ApiError::TooManyConnections)
    }

    /// Writes the error's envelope; returns its status.
    pub fn write(&self, out: &mut Vec<u8>, keep_alive: bool) -> u16 {
        let keep_alive = keep_alive && !self.closes_connection();
        let allow = match self {
            ApiError::MethodNotAllowed { allow, .. } => Some(*allow),
            _ => None,
        };
        let mut envelope =
            Envelope::start_with_allow(out, self.status(), keep_alive, allow, format_args!("{}", self.message()));
        if let ApiError::BadBody { detail } = self {
            super::json::write_str(envelope.error(self.code()), "The body you provided in your request is invalid.");
            envelope.detail(detail);
            return envelope.finish();
        }
        envelope.simple_error(self.code(), format_args!("{self}"))
    }
}

/// The description of the error.
impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::BadBody { detail } => write!(f, "The body you provided in your request is invalid: {detail}"),
            ApiError::NoApiKey { header } => write!(f, "the {header} header is missing or empty"),
            ApiError::InvalidApiKey { header } => write!(f, "the {header} header does not hold this server's API key"),
            ApiError::ReadOnlyKey { what } => write!(
                f,
                "the read-only API key may not {what}: it may search, retrieve, scroll, read stats, list indexes, \
                 download snapshots and read the cluster's status"
            ),
            ApiError::NotReady { reason } | ApiError::SnapshotUnavailable { reason } => f.write_str(reason),
            ApiError::NotFound { path } => write!(f, "there is no endpoint at '{path}'"),
            ApiError::MethodNotAllowed { path, allow } => write!(f, "'{path}' accepts only {allow}"),
            ApiError::IndexNotFound { name, .. } => write!(f, "index '{name}' does not exist"),
            ApiError::IndexNameInvalid { name, bytes_max } => {
                write!(f, "index name '{name}' is invalid: it must be 3 to {bytes_max} characters of a-z, 0-9 and '-'")
            }
            ApiError::TooManyIndexes { max } => {
                write!(f, "the server already holds the most indexes it may ({max}, --indexes-max)")
            }
            ApiError::IndexExists { name } => write!(f, "index '{name}' already exists"),
            ApiError::InvalidMetric { metric } => {
                write!(f, "metric '{metric}' is not supported; allowed values: {}", Metric::ALLOWED)
            }
            ApiError::SearchFailed { reason } => f.write_str(reason),
            ApiError::ReplyTooLarge { bytes, max, fit: 0, what } => write!(
                f,
                "the reply would take up to {bytes} bytes, more than the {max} one reply may (--reply-bytes-max); \
                 not even one of the {what} fits"
            ),
            ApiError::ReplyTooLarge { bytes, max, fit, what } => write!(
                f,
                "the reply would take up to {bytes} bytes, more than the {max} one reply may (--reply-bytes-max); \
                 ask for at most {fit} {what} per request"
            ),
            ApiError::Http { error: HttpError::BodyTooLarge, body_bytes_max } => {
                write!(f, "the request body is larger than the limit of {body_bytes_max} bytes")
            }
            ApiError::Http { error, .. } => write!(f, "{error}"),
            ApiError::Timeout => f.write_str("the request was not received in time"),
            ApiError::TooManyConnections => f.write_str("the server has too many open connections; try again later"),
            ApiError::Storage(error) => write!(f, "{error}"),
            ApiError::ClusterUnavailable { reason } => f.write_str(reason),
            ApiError::BadConsistency { value } => {
                write!(f, "consistency '{value}' is not supported; allowed values: linearizable, local")
            }
            ApiError::NotACluster => f.write_str(
                "this server is a single node: it has no members to add or remove (a cluster's nodes are started \
                 with --node-id, --peer-addr and --initial-peers)",
            ),
            ApiError::MemberExists { id, address } => write!(
                f,
                "node {id} is already a member, at {address}; a node that lost its data directory rejoins under a new id"
            ),
            ApiError::MemberNotFound { id } => write!(f, "node '{id}' is not a member of this cluster"),
            ApiError::LastVoter { id } => {
                write!(f, "node {id} is the only voting member: removing it would leave nobody to decide")
            }
        }
    }
}

//! What a request asks for, once routed: known to the API, which answers it,
//! and to metrics, which count it. It depends on nothing.

/// Every endpoint the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    /// `GET /api/v1/test-auth`, which EigenDB's published client calls to check its key.
    TestAuth,
    /// `GET /metrics`: Prometheus text format.
    Metrics,
    /// `GET /api/v1/openapi.json`: the interface description.
    OpenApi,
    ListIndexes,
    CreateIndex,
    IndexStats,
    DeleteIndex,
    Search,
    /// `POST /api/v1/embeddings/{name}/search-batch`: many searches, one pass.
    SearchBatch,
    /// `POST /api/v1/embeddings/{name}/scroll`: rows in order of id, a page at a time.
    Scroll,
    Upsert,
    Insert,
    Retrieve,
    DeleteEmbeddings,
    /// `GET /api/v1/cluster`: this node's view of the cluster.
    Cluster,
    /// `POST /api/v1/cluster/members`: a node joins, as a learner, then a voter.
    AddMember,
    /// `DELETE /api/v1/cluster/members/{id}`: a node leaves.
    RemoveMember,
    /// `GET /api/v1/indexes/{name}/snapshot`: the index's snapshot image, sent
    /// by a forked child while the server goes on.
    IndexSnapshot,
    /// `PUT /api/v1/indexes/{name}/restore`: a new index from a snapshot image.
    RestoreIndex,
    /// `GET /healthz`: the process answers (a liveness probe).
    Live,
    /// `GET /readyz`: the data is loaded and, in a cluster, a leader known
    /// and this node caught up with what it knows committed.
    Ready,
}

impl Endpoint {
    /// Every endpoint, in declaration order (`endpoint as usize` is its position).
    pub const ALL: [Endpoint; 22] = [
        Endpoint::Health,
        Endpoint::TestAuth,
        Endpoint::Metrics,
        Endpoint::OpenApi,
        Endpoint::ListIndexes,
        Endpoint::CreateIndex,
        Endpoint::IndexStats,
        Endpoint::DeleteIndex,
        Endpoint::Search,
        Endpoint::SearchBatch,
        Endpoint::Scroll,
        Endpoint::Upsert,
        Endpoint::Insert,
        Endpoint::Retrieve,
        Endpoint::DeleteEmbeddings,
        Endpoint::Cluster,
        Endpoint::AddMember,
        Endpoint::RemoveMember,
        Endpoint::IndexSnapshot,
        Endpoint::RestoreIndex,
        Endpoint::Live,
        Endpoint::Ready,
    ];

    /// Its `route` label in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Health => "health",
            Endpoint::TestAuth => "test_auth",
            Endpoint::Metrics => "metrics",
            Endpoint::OpenApi => "openapi",
            Endpoint::ListIndexes => "list_indexes",
            Endpoint::CreateIndex => "create_index",
            Endpoint::IndexStats => "index_stats",
            Endpoint::DeleteIndex => "delete_index",
            Endpoint::Search => "search",
            Endpoint::SearchBatch => "search_batch",
            Endpoint::Scroll => "scroll",
            Endpoint::Upsert => "upsert",
            Endpoint::Insert => "insert",
            Endpoint::Retrieve => "retrieve",
            Endpoint::DeleteEmbeddings => "delete_embeddings",
            Endpoint::Cluster => "cluster",
            Endpoint::AddMember => "add_member",
            Endpoint::RemoveMember => "remove_member",
            Endpoint::IndexSnapshot => "index_snapshot",
            Endpoint::RestoreIndex => "restore_index",
            Endpoint::Live => "healthz",
            Endpoint::Ready => "readyz",
        }
    }

    /// Whether answering may change the store.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Endpoint::CreateIndex
                | Endpoint::DeleteIndex
                | Endpoint::RestoreIndex
                | Endpoint::Upsert
                | Endpoint::Insert
                | Endpoint::DeleteEmbeddings
        )
    }

    /// Whether the read-only API key may ask for it: everything that reads
    /// and changes nothing (probes and the open endpoints need no key).
    pub fn read_only(self) -> bool {
        !self.writes() && !self.changes_members()
    }

    /// Whether it changes the cluster's members.
    pub fn changes_members(self) -> bool {
        matches!(self, Endpoint::AddMember | Endpoint::RemoveMember)
    }

    /// Whether answering reads indexes or embeddings (and so must not see
    /// writes that are not yet durable).
    pub fn reads_data(self) -> bool {
        matches!(
            self,
            Endpoint::ListIndexes
                | Endpoint::IndexStats
                | Endpoint::IndexSnapshot
                | Endpoint::Search
                | Endpoint::SearchBatch
                | Endpoint::Scroll
                | Endpoint::Retrieve
        )
    }
}

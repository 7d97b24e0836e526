//! Routing: from a request's method and path to its endpoint, before any
//! byte of its body is read.

use std::ops::Range;

use super::ApiError;
use crate::endpoint::Endpoint;
use crate::http::Method;

/// A routed request: its endpoint and where the index name sits in the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    pub name: Range<usize>,
}

/// Finds the endpoint for a method and path: 404 for an unknown path, 405
/// (with the allowed method) for a known path asked with another method.
pub fn route(method: Method, path: &str) -> Result<Target, ApiError> {
    let not_found = || ApiError::NotFound { path: path.to_owned() };
    let outside = match path {
        "/metrics" => Some(Endpoint::Metrics),
        "/healthz" => Some(Endpoint::Live),
        "/readyz" => Some(Endpoint::Ready),
        _ => None,
    };
    if let Some(endpoint) = outside {
        return if method == Method::Get {
            Ok(Target { endpoint, name: 0..0 })
        } else {
            Err(ApiError::MethodNotAllowed { path: path.to_owned(), allow: "GET" })
        };
    }
    let rest = path.strip_prefix("/api/v1/").ok_or_else(not_found)?;
    let mut segments = rest.split('/');
    let parts = (segments.next(), segments.next(), segments.next(), segments.next());
    let name_at = |name: &str| {
        let start = name.as_ptr() as usize - path.as_ptr() as usize;
        start..start + name.len()
    };
    let (endpoint, allowed, name) = match parts {
        (Some("health"), None, None, None) => (Endpoint::Health, Method::Get, 0..0),
        (Some("test-auth"), None, None, None) => (Endpoint::TestAuth, Method::Get, 0..0),
        (Some("openapi.json"), None, None, None) => (Endpoint::OpenApi, Method::Get, 0..0),
        (Some("cluster"), None, None, None) => (Endpoint::Cluster, Method::Get, 0..0),
        (Some("cluster"), Some("members"), None, None) => (Endpoint::AddMember, Method::Post, 0..0),
        (Some("cluster"), Some("members"), Some(id), None) => (Endpoint::RemoveMember, Method::Delete, name_at(id)),
        (Some("indexes"), Some("list"), None, None) => (Endpoint::ListIndexes, Method::Get, 0..0),
        (Some("indexes"), Some(name), Some(action), None) => {
            let (endpoint, allowed) = match action {
                "create" => (Endpoint::CreateIndex, Method::Put),
                "stats" => (Endpoint::IndexStats, Method::Get),
                "delete" => (Endpoint::DeleteIndex, Method::Delete),
                "snapshot" => (Endpoint::IndexSnapshot, Method::Get),
                "restore" => (Endpoint::RestoreIndex, Method::Put),
                _ => return Err(not_found()),
            };
            (endpoint, allowed, name_at(name))
        }
        (Some("embeddings"), Some(name), Some(action), None) => {
            let (endpoint, allowed) = match action {
                "search" => (Endpoint::Search, Method::Post),
                "search-batch" => (Endpoint::SearchBatch, Method::Post),
                "scroll" => (Endpoint::Scroll, Method::Post),
                "upsert" => (Endpoint::Upsert, Method::Put),
                "insert" => (Endpoint::Insert, Method::Put),
                "retrieve" => (Endpoint::Retrieve, Method::Post),
                "delete" => (Endpoint::DeleteEmbeddings, Method::Delete),
                _ => return Err(not_found()),
            };
            (endpoint, allowed, name_at(name))
        }
        _ => return Err(not_found()),
    };
    if method != allowed {
        let allow = match allowed {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete | Method::Other => "DELETE",
        };
        return Err(ApiError::MethodNotAllowed { path: path.to_owned(), allow });
    }
    Ok(Target { endpoint, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_their_refusals() {
        let target = route(Method::Put, "/api/v1/indexes/abc/create").unwrap();
        assert_eq!(target.endpoint, Endpoint::CreateIndex);
        assert_eq!(&"/api/v1/indexes/abc/create"[target.name], "abc");
        assert_eq!(route(Method::Get, "/api/v1/indexes/list").unwrap().endpoint, Endpoint::ListIndexes);
        for (position, endpoint) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(endpoint as usize, position, "Endpoint::ALL is in declaration order");
        }
        assert_eq!(route(Method::Delete, "/api/v1/embeddings/x/delete").unwrap().endpoint, Endpoint::DeleteEmbeddings);
        assert!(matches!(route(Method::Get, "/api/v1/nope"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/api/v1/health/"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/api/v1/indexes/a/create/x"), Err(ApiError::NotFound { .. })));
        assert!(matches!(route(Method::Get, "/"), Err(ApiError::NotFound { .. })));
        assert_eq!(route(Method::Get, "/healthz").unwrap().endpoint, Endpoint::Live);
        assert_eq!(route(Method::Get, "/readyz").unwrap().endpoint, Endpoint::Ready);
        assert!(matches!(route(Method::Post, "/readyz"), Err(ApiError::MethodNotAllowed { allow: "GET", .. })));
        assert!(matches!(route(Method::Get, "/readyz/"), Err(ApiError::NotFound { .. })));
        assert_eq!(
            route(Method::Post, "/api/v1/embeddings/x/upsert"),
            Err(ApiError::MethodNotAllowed { path: "/api/v1/embeddings/x/upsert".into(), allow: "PUT" })
        );
    }
}

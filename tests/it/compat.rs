//! Compatibility with EigenDB's published client: the `X-Eigen-API-Key`
//! header and `GET /api/v1/test-auth`.

use crate::harness::{create_index, Server, KEY};

#[test]
fn test_auth_answers_by_the_contract_rules() {
    let server = Server::start();
    for header in ["X-Service-API-Key", "X-Eigen-API-Key", "x-eigen-api-key"] {
        let r = server.connect().call_with("GET", "/api/v1/test-auth", &[(header, KEY)], None);
        r.check_envelope();
        assert_eq!((r.status, r.message()), (200, "Authenticated."), "{header}");
        let r = server.connect().call_with("GET", "/api/v1/test-auth", &[(header, "wrong")], None);
        assert_eq!((r.status, r.code(), r.message()), (401, "INVALID_API_KEY", "Invalid API key."), "{header}");
        // The description names the header the client sent, as it is spelled here.
        let named = if header.contains("igen") { "X-Eigen-API-Key" } else { "X-Service-API-Key" };
        let description = format!("the {named} header does not hold this server's API key");
        assert_eq!(r.body["error"]["description"], description.as_str(), "{header}");
    }
    let r = server.connect().call_with("GET", "/api/v1/test-auth", &[], None);
    assert_eq!((r.status, r.code(), r.message()), (401, "NO_API_KEY_PROVIDED", "No API key provided."));
    assert_eq!(r.body["error"]["description"], "the X-Service-API-Key header is missing or empty");
    let r = server.connect().call_with("GET", "/api/v1/test-auth", &[("X-Eigen-API-Key", "")], None);
    assert_eq!(r.code(), "NO_API_KEY_PROVIDED");
    assert_eq!(r.body["error"]["description"], "the X-Eigen-API-Key header is missing or empty");
    let both = [("X-Eigen-API-Key", KEY), ("X-Service-API-Key", "wrong")];
    let r = server.connect().call_with("GET", "/api/v1/test-auth", &both, None);
    assert_eq!(r.body["error"]["description"], "the X-Service-API-Key header does not hold this server's API key");
    let r = server.connect().call_with("POST", "/api/v1/test-auth", &[("X-Eigen-API-Key", KEY)], None);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
}

#[test]
fn the_eigen_header_works_on_every_endpoint_and_yields_to_the_service_header() {
    let server = Server::start();
    create_index(&server, "alias", 2, "l2");
    let eigen = [("X-Eigen-API-Key", KEY)];
    let mut client = server.connect();
    for (method, path, body) in [
        ("GET", "/api/v1/indexes/list", None),
        ("GET", "/api/v1/indexes/alias/stats", None),
        ("PUT", "/api/v1/embeddings/alias/insert", Some(r#"{"embeddings":[{"id":1,"data":[1,2]}]}"#)),
        ("PUT", "/api/v1/embeddings/alias/upsert", Some(r#"{"embeddings":[{"id":2,"data":[2,2]}]}"#)),
        ("POST", "/api/v1/embeddings/alias/search", Some(r#"{"queryVector":[1,2],"k":2}"#)),
        ("POST", "/api/v1/embeddings/alias/retrieve", Some(r#"{"ids":[1,2]}"#)),
        ("DELETE", "/api/v1/embeddings/alias/delete", Some(r#"{"ids":[1]}"#)),
        ("PUT", "/api/v1/indexes/second/create", Some(r#"{"dimensions":1,"metric":"ip"}"#)),
        ("DELETE", "/api/v1/indexes/second/delete", None),
    ] {
        let r = client.call_with(method, path, &eigen, body);
        assert_eq!(r.status, 200, "{method} {path}: {r:?}");
    }
    // With both headers, X-Service-API-Key decides.
    let both_good_service = [("X-Eigen-API-Key", "wrong"), ("X-Service-API-Key", KEY)];
    assert_eq!(client.call_with("GET", "/api/v1/indexes/list", &both_good_service, None).status, 200);
    let both_bad_service = [("X-Eigen-API-Key", KEY), ("X-Service-API-Key", "wrong")];
    assert_eq!(client.call_with("GET", "/api/v1/indexes/list", &both_bad_service, None).code(), "INVALID_API_KEY");
}

//! The server's API as `quiver import` and `export` use it: blocking calls
//! over HTTP (ureq), each answer's envelope read back with serde_json.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// A failed call: what was asked, and what came back (or why nothing did).
#[derive(Debug)]
pub struct CallError {
    pub status: Option<u16>,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One answer: its status and its envelope.
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The envelope's error code, if any.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// The error as one line: code, description and detail.
    pub fn error_text(&self) -> String {
        let error = &self.body["error"];
        let description = match &error["description"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let detail = error["detail"].as_str().map(|d| format!(" ({d})")).unwrap_or_default();
        format!("{} {}: {description}{detail}", self.status, self.code())
    }
}

/// A server at `url`, called with `key`.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    url: String,
    key: String,
}

/// The most memory taken ahead for an answer on its Content-Length's word
/// (beyond it, the buffer grows as the bytes come): a server's head alone
/// cannot make the tool take more.
const CAPACITY_AHEAD_BYTES_MAX: usize = 1 << 30;

/// How long one call may take before the tool gives up on it.
const CALL_TIMEOUT_S: u64 = 600;

impl Client {
    /// A client of the server at `url`; over https, trusting the
    /// certificates of the PEM file `ca_cert` if one is named, else the
    /// public authorities.
    pub fn new(url: &str, key: &str, ca_cert: Option<&Path>) -> Result<Client, String> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = ca_cert {
            tls = tls.root_certs(trusted(path)?);
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(CALL_TIMEOUT_S)))
            .tls_config(tls.build())
            .build();
        Ok(Client { agent: config.new_agent(), url: url.trim_end_matches('/').to_owned(), key: key.to_owned() })
    }

    /// A call whose answer is an envelope.
    pub fn call(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Answer, CallError> {
        let (status, bytes) = self.call_bytes(method, path, body)?;
        let body = serde_json::from_slice(&bytes).map_err(|e| CallError {
            status: Some(status),
            message: format!("{method} {path}: the answer is not JSON ({e}); is {} a quiver server?", self.url),
        })?;
        Ok(Answer { status, body })
    }

    /// A call whose answer is returned as bytes, with its status.
    pub fn call_bytes(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, Vec<u8>), CallError> {
        let url = format!("{}{path}", self.url);
        let failed = |e: ureq::Error| {
            let text = e.to_string();
            let hint = match text.contains("certificate") {
                true => {
                    " (a server's self-signed certificate, or a private authority's, is trusted with --ca-cert; \
                     one made for a server must not be marked as an authority: CA:FALSE)"
                }
                false => "",
            };
            CallError { status: None, message: format!("{method} {url}: {text}{hint}") }
        };
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("X-Service-API-Key", &self.key)
            .header("Content-Type", "application/json")
            .body(body.unwrap_or_default().to_vec())
            .map_err(|e| CallError { status: None, message: format!("{method} {url}: {e}") })?;
        let mut response = self.agent.run(request).map_err(failed)?;
        let status = response.status().as_u16();
        // Sized once from the head: a snapshot download is hundreds of MB.
        let length = response.body().content_length().unwrap_or(0);
        let mut bytes = Vec::with_capacity(usize::try_from(length).unwrap_or(0).min(CAPACITY_AHEAD_BYTES_MAX));
        response.body_mut().as_reader().read_to_end(&mut bytes).map_err(|e| CallError {
            status: Some(status),
            message: format!("{method} {url}: the answer broke off: {e}"),
        })?;
        Ok((status, bytes))
    }

    /// The index's dimensions, or why it cannot be used.
    pub fn dimensions(&self, index: &str) -> Result<usize, CallError> {
        let answer = self.call("GET", &format!("/api/v1/indexes/{index}/stats"), None)?;
        if answer.status != 200 {
            return Err(CallError { status: Some(answer.status), message: answer.error_text() });
        }
        answer.body["data"]["dimensions"].as_u64().map(|d| d as usize).ok_or_else(|| CallError {
            status: Some(answer.status),
            message: "the index's stats name no dimensions".to_owned(),
        })
    }
}

/// The certificates of a PEM file, as the roots a client trusts.
fn trusted(path: &Path) -> Result<ureq::tls::RootCerts, String> {
    let pem = std::fs::read(path).map_err(|e| format!("--ca-cert {}: {e}", path.display()))?;
    let mut certificates = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(certificate)) => certificates.push(certificate),
            Ok(_) => {}
            Err(e) => return Err(format!("--ca-cert {}: not PEM: {e}", path.display())),
        }
    }
    if certificates.is_empty() {
        return Err(format!("--ca-cert {}: no CERTIFICATE block in it", path.display()));
    }
    Ok(certificates.into())
}

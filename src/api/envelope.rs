//! The response envelope `{"status", "message", "data"?, "error"?}`, written
//! field by field into the connection's write buffer.

use std::fmt;

use super::json;
use crate::http::response::{self, Pending};

pub struct Envelope<'a> {
    out: &'a mut Vec<u8>,
    pending: Pending,
}

impl<'a> Envelope<'a> {
    /// Writes the HTTP head and `{"status":S,"message":"..."`.
    pub fn start(out: &'a mut Vec<u8>, status: u16, keep_alive: bool, message: fmt::Arguments<'_>) -> Envelope<'a> {
        Envelope::start_with_allow(out, status, keep_alive, None, message)
    }

    pub fn start_with_allow(
        out: &'a mut Vec<u8>,
        status: u16,
        keep_alive: bool,
        allow: Option<&str>,
        message: fmt::Arguments<'_>,
    ) -> Envelope<'a> {
        let pending = response::start(out, status, keep_alive, allow);
        out.extend_from_slice(b"{\"status\":");
        json::write_u64(out, u64::from(status));
        out.extend_from_slice(b",\"message\":");
        json::write_fmt_str(out, message);
        Envelope { out, pending }
    }

    /// Opens `"data":`; the caller writes one JSON value into `out()`.
    pub fn data(&mut self) -> &mut Vec<u8> {
        self.out.extend_from_slice(b",\"data\":");
        self.out
    }

    /// Opens `"error":{"code":"...","description":`; the caller writes the
    /// description value, then calls `detail` or `end_error`.
    pub fn error(&mut self, code: &str) -> &mut Vec<u8> {
        self.out.extend_from_slice(b",\"error\":{\"code\":");
        json::write_str(self.out, code);
        self.out.extend_from_slice(b",\"description\":");
        self.out
    }

    /// Adds `"detail"` to an open error and closes it.
    pub fn detail(&mut self, detail: &str) {
        self.out.extend_from_slice(b",\"detail\":");
        json::write_str(self.out, detail);
        self.end_error();
    }

    pub fn end_error(&mut self) {
        self.out.push(b'}');
    }

    /// An error with a plain string description; finishes the envelope.
    pub fn simple_error(mut self, code: &str, description: fmt::Arguments<'_>) -> u16 {
        let out = self.error(code);
        json::write_fmt_str(out, description);
        self.end_error();
        self.finish()
    }

    /// Closes the envelope and fills in its length; returns its status.
    pub fn finish(self) -> u16 {
        self.out.push(b'}');
        response::finish(self.out, self.pending)
    }
}

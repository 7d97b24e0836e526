//! cargo-fuzz entry for `wal_record`; the property is in `../targets.rs`.
#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|input: &[u8]| targets::wal_record(input));

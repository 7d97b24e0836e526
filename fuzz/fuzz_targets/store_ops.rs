//! cargo-fuzz entry for `store_ops`; the property is in `../targets.rs`.
#![no_main]

#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|input: &[u8]| targets::store_ops(input));

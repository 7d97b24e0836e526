//! Converts `openapi.yaml` (the one source of the interface description) to
//! the JSON that `GET /api/v1/openapi.json` serves.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=openapi.yaml");
    let yaml = std::fs::read_to_string("openapi.yaml").expect("read openapi.yaml");
    let document: serde_json::Value = yaml_serde::from_str(&yaml).expect("openapi.yaml is valid YAML");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out).join("openapi.json"), serde_json::to_string(&document).unwrap())
        .expect("write openapi.json");
}

//! Fuzz targets live in `tests/fuzz.rs`.

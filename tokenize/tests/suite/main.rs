//! The tokenizer's integration tests, one binary: a binary per file cost ~27 MB of disk and a link
//! each in every clean build (README, "Disk").
mod common;
mod model_dir;
mod properties;
mod speed;
mod stream;
mod templates;

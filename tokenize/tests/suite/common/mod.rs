//! Shared by the integration tests: scratch directories and the fixture models, loaded once.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use pdgate_tokenize::{fixture, Tokenizer};

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pdgate-tokenize-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a scratch directory");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create a directory");
        }
        std::fs::write(&p, text).expect("write a file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The byte-level ChatML fixture, loaded once per test binary.
pub fn chatml() -> Arc<Tokenizer> {
    static MODEL: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = TempDir::new("chatml");
            fixture::write_model_dir(dir.path()).expect("write the fixture");
            Arc::new(Tokenizer::from_dir(dir.path()).expect("load the fixture"))
        })
        .clone()
}

/// The SentencePiece-style fixture, loaded once per test binary.
pub fn sentencepiece() -> Arc<Tokenizer> {
    static MODEL: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = TempDir::new("sp");
            fixture::write_sentencepiece_model_dir(dir.path()).expect("write the fixture");
            Arc::new(Tokenizer::from_dir(dir.path()).expect("load the fixture"))
        })
        .clone()
}

//! The tokenizers of the gRPC path, one loaded instance per model directory, shared by every
//! request (`Arc<Tokenizer>`).
//!
//! Where a request's tokenizer comes from (SMG's order, digest §1.8): `--tokenizer-path` /
//! `--model-path` (with `--chat-template`) when the gateway was started with them — loaded at
//! startup, so a bad directory stops the gateway with the file and the reason — else the
//! tokenizer or model path the prefill worker reported, when that directory exists on this
//! host (loaded on first use, off the reactor, and kept). No hub downloads: pdgate runs offline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pdgate_tokenize::{ModelSource, Tokenizer};

use crate::config::GatewayConfig;

pub struct Models {
    /// The tokenizer of `--model-path` / `--tokenizer-path`, when configured.
    configured: Option<Arc<Tokenizer>>,
    /// `--chat-template`, applied to tokenizers loaded from workers' paths too.
    chat_template: Option<PathBuf>,
    /// Tokenizers loaded from workers' reported paths, by path.
    by_path: Mutex<HashMap<PathBuf, Arc<Tokenizer>>>,
}

impl Models {
    /// Loads the configured tokenizer (none configured: nothing loaded). The error names the
    /// file and what is wrong with it.
    pub fn load(cfg: &GatewayConfig) -> Result<Models, String> {
        let chat_template = cfg.chat_template.as_ref().map(PathBuf::from);
        let source = ModelSource {
            model_path: cfg.model_path.as_ref().map(PathBuf::from),
            tokenizer_path: cfg.tokenizer_path.as_ref().map(PathBuf::from),
            chat_template: chat_template.clone(),
        };
        let configured = if source.model_path.is_some() || source.tokenizer_path.is_some() {
            let tok =
                Tokenizer::load(&source).map_err(|e| format!("loading the tokenizer: {e}"))?;
            log::info!(
                "tokenizer loaded from {} ({} tokens, EOS {:?})",
                source
                    .tokenizer_path
                    .as_ref()
                    .or(source.model_path.as_ref())
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                tok.vocab_size(),
                tok.eos_token_ids()
            );
            Some(Arc::new(tok))
        } else {
            None
        };
        Ok(Models {
            configured,
            chat_template,
            by_path: Mutex::new(HashMap::new()),
        })
    }

    /// No tokenizer configured (tests, HTTP-only fleets).
    pub fn none() -> Models {
        Models {
            configured: None,
            chat_template: None,
            by_path: Mutex::new(HashMap::new()),
        }
    }

    /// The tokenizer for a request served by a worker that reported `worker_path` (its
    /// tokenizer or model directory). `Err`: the reason none is available, for the client.
    pub async fn tokenizer(&self, worker_path: Option<&Path>) -> Result<Arc<Tokenizer>, String> {
        if let Some(t) = &self.configured {
            return Ok(t.clone());
        }
        let Some(path) = worker_path else {
            return Err(
                "no tokenizer: start pdgate with --model-path or --tokenizer-path (the worker \
                 reported no tokenizer path)"
                    .into(),
            );
        };
        if let Some(t) = self.cached(path) {
            return Ok(t);
        }
        let source = ModelSource {
            model_path: Some(path.to_path_buf()),
            tokenizer_path: None,
            chat_template: self.chat_template.clone(),
        };
        let loaded = tokio::task::spawn_blocking(move || Tokenizer::load(&source))
            .await
            .map_err(|e| format!("loading the tokenizer: {e}"))?
            .map_err(|e| {
                format!(
                    "no tokenizer: the worker's tokenizer path {} does not load here ({e}); \
                     start pdgate with --model-path",
                    path.display()
                )
            })?;
        let loaded = Arc::new(loaded);
        let mut map = self.by_path.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(path.to_path_buf()).or_insert(loaded).clone())
    }

    fn cached(&self, path: &Path) -> Option<Arc<Tokenizer>> {
        self.by_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
    }
}

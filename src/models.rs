//! The tokenizers of the gRPC path, one loaded instance per model directory, shared by every
//! request (`Arc<Tokenizer>`).
//!
//! Where a request's tokenizer comes from (SMG's order, digest §1.8): `--tokenizer-path` /
//! `--model-path` (with `--chat-template`) when the gateway was started with them — loaded at
//! startup, so a bad directory stops the gateway with the file and the reason — else the
//! tokenizer or model path the prefill worker reported, when that directory exists on this
//! host (loaded on first use, off the reactor, and kept). No hub downloads: pdgate runs offline.
//! Vision models' image processors come from the same directory (`preprocessor_config.json`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pdgate_mm::ImageProcessor;
use pdgate_tokenize::{CacheConfig, ModelSource, Tokenizer};

/// A vision model's image processor and the prompt token it expands per image.
pub struct Vision {
    pub processor: ImageProcessor,
    pub image_token_id: u32,
}

use crate::config::GatewayConfig;

pub struct Models {
    /// The tokenizer of `--model-path` / `--tokenizer-path`, when configured.
    configured: Option<Arc<Tokenizer>>,
    /// `--model-path`: where the image processor (`preprocessor_config.json`) is read from.
    model_path: Option<PathBuf>,
    /// Image processors by the model path they were asked for (a directory, or a file in it;
    /// `None`: the directory has none), read on first use.
    vision: Mutex<HashMap<PathBuf, Option<Arc<Vision>>>>,
    /// `--chat-template`, applied to tokenizers loaded from workers' paths too.
    chat_template: Option<PathBuf>,
    /// Tokenizers loaded from workers' reported paths, by path.
    by_path: Mutex<HashMap<PathBuf, Arc<Tokenizer>>>,
    /// `--tokenizer-cache-*`, given to every tokenizer loaded.
    cache: CacheConfig,
}

/// The caches `--tokenizer-cache-enable-l0/-l1` ask for (a level left off has no room).
fn cache_config(cfg: &GatewayConfig) -> CacheConfig {
    CacheConfig {
        l0_max_entries: if cfg.tokenizer_cache_enable_l0 {
            cfg.tokenizer_cache_l0_max_entries
        } else {
            0
        },
        l1_max_bytes: if cfg.tokenizer_cache_enable_l1 {
            cfg.tokenizer_cache_l1_max_memory
        } else {
            0
        },
    }
}

/// `tok` with the configured caches; a tokenizer whose pieces cannot be cached apart says so
/// in the log (its whole-prompt cache still works).
fn with_cache(mut tok: Tokenizer, cache: CacheConfig, from: &Path) -> Tokenizer {
    if cache == CacheConfig::default() {
        return tok;
    }
    let l1_refused = tok.set_cache(cache);
    if let Some(why) = &l1_refused {
        log::warn!(
            "tokenizer of {}: the L1 tokenizer cache stays off ({why}); L0 is unaffected",
            from.display()
        );
    }
    log::info!(
        "tokenizer of {}: caches L0 {} prompts, L1 {} bytes",
        from.display(),
        cache.l0_max_entries,
        if l1_refused.is_some() {
            0
        } else {
            cache.l1_max_bytes
        }
    );
    tok
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
        let cache = cache_config(cfg);
        let configured = if let Some(from) = source
            .tokenizer_path
            .as_ref()
            .or(source.model_path.as_ref())
        {
            let tok =
                Tokenizer::load(&source).map_err(|e| format!("loading the tokenizer: {e}"))?;
            log::info!(
                "tokenizer loaded from {} ({} tokens, EOS {:?})",
                from.display(),
                tok.vocab_size(),
                tok.eos_token_ids()
            );
            Some(Arc::new(with_cache(tok, cache, from)))
        } else {
            None
        };
        Ok(Models {
            configured,
            model_path: cfg.model_path.as_ref().map(PathBuf::from),
            vision: Mutex::new(HashMap::new()),
            chat_template,
            by_path: Mutex::new(HashMap::new()),
            cache,
        })
    }

    /// No tokenizer configured (tests, HTTP-only fleets).
    pub fn none() -> Models {
        Models {
            configured: None,
            model_path: None,
            vision: Mutex::new(HashMap::new()),
            chat_template: None,
            by_path: Mutex::new(HashMap::new()),
            cache: CacheConfig::default(),
        }
    }

    /// The image processor of the request's model: `--model-path`'s, else the directory the
    /// prefill worker reported (read off the reactor on first use, then kept). `Ok(None)`: the
    /// model directory has no `preprocessor_config.json` (a text model). The placeholder id
    /// comes from `config.json`, else from `tokenizer`'s vocabulary.
    pub async fn vision(
        &self,
        tokenizer: &Tokenizer,
        worker_path: impl FnOnce() -> Option<PathBuf>,
    ) -> Result<Option<Arc<Vision>>, String> {
        let reported;
        let given = match self.model_path.as_deref() {
            Some(path) => path,
            None => {
                reported = worker_path();
                match reported.as_deref() {
                    Some(path) => path,
                    None => return Ok(None),
                }
            }
        };
        // Looked up by the path as given, so the file system is asked (is it a file?) only the
        // first time, not on every request with an image.
        if let Some(v) = self
            .vision
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(given)
        {
            return Ok(v.clone());
        }
        let dir = if given.is_file() {
            given.parent().unwrap_or(given)
        } else {
            given
        };
        let owned = dir.to_path_buf();
        let loaded = tokio::task::spawn_blocking(move || ImageProcessor::from_model_dir(&owned))
            .await
            .map_err(|e| format!("loading the image processor: {e}"))?
            .map_err(|e| {
                format!(
                    "the image processor of {} does not load: {e}",
                    dir.display()
                )
            })?;
        let vision = match loaded {
            None => None,
            Some(processor) => {
                let token = processor
                    .image_token_id()
                    .or_else(|| tokenizer.token_to_id(processor.image_token_text()))
                    .ok_or_else(|| {
                        format!(
                            "the model in {} has an image processor but no image token ({} is \
                             neither in config.json nor in the tokenizer)",
                            dir.display(),
                            processor.image_token_text()
                        )
                    })?;
                Some(Arc::new(Vision {
                    processor,
                    image_token_id: token,
                }))
            }
        };
        let mut map = self.vision.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(given.to_path_buf()).or_insert(vision).clone())
    }

    /// The tokenizer for a request served by a worker that reports `worker_path` (its
    /// tokenizer or model directory; asked only without a configured tokenizer: it checks the
    /// file system). `Err`: the reason none is available, for the client.
    pub async fn tokenizer(
        &self,
        worker_path: impl FnOnce() -> Option<PathBuf>,
    ) -> Result<Arc<Tokenizer>, String> {
        if let Some(t) = &self.configured {
            return Ok(t.clone());
        }
        let worker_path = worker_path();
        let Some(path) = worker_path.as_deref() else {
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
        let loaded = Arc::new(with_cache(loaded, self.cache, path));
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

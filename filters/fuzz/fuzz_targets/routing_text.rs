//! `routing_text` (the prompt a routing policy keys on) on every route.
//!
//! Properties: never panics; what it extracts comes out of the body, so it is never larger than
//! the body (a hostile request cannot make a policy allocate more than it sent); token ids come
//! only from `/generate` and `/v1/completions`, and all fit the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::routing_text::routing_text;
use pdgate_filters::{scan_object, Route};

fuzz_target!(|data: &[u8]| {
    let Ok(top) = scan_object(data) else { return };
    for route in Route::ALL {
        let t = routing_text(route, data, &top);
        if let Some(text) = &t.text {
            assert!(
                text.len() <= data.len(),
                "{route:?}: text larger than the body"
            );
        }
        if let Some(ids) = &t.token_ids {
            assert!(
                matches!(route, Route::Generate | Route::Completions),
                "{route:?}: token ids"
            );
            assert!(
                ids.len() <= data.len() / 2,
                "{route:?}: more ids than the body holds"
            );
        }
    }
});

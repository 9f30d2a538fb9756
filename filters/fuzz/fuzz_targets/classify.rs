//! `classify` (and `cap_field`) on every route, against an independent reading of the body.
//!
//! Properties: for any JSON object and every route, `classify` returns exactly the facts (or the
//! first wrong-typed field) that a plain reading of the documented rules gives — `null` is
//! absent, last duplicate wins, `n` in 1..=1024, batch shapes per route capped at 65536 (token-id
//! lists hold only integers), logprob switches per route, `request_id`/`rid`, the route's cap
//! field, then the body's shape (`shape_oracle`) — and never panics.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use pdgate_filters::classify::{
    cap_field, classify, ClassifyError, RequestFacts, MAX_BATCH, MAX_N,
};
use pdgate_filters::{scan_object, Route};
use pdgate_filters_fuzz::{elements, lit, non_null, raw_fields, shape_oracle, value_of, Lit};
use serde_json::value::RawValue;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(top) = scan_object(data) else { return };
    let fields = raw_fields(data).expect("a scanned object reads as a map");
    for route in Route::ALL {
        let got = classify(route, data, &top);
        let want = oracle(route, &fields);
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{route:?}"),
            (Err(g), Err(field)) => assert_eq!(g.field, *field, "{route:?}: {g}"),
            _ => panic!("{route:?}: classify {got:?}, expected {want:?}"),
        }
        assert_eq!(
            cap_field(route, data, &top),
            oracle_cap(route, &fields),
            "{route:?}"
        );
        if let Ok(f) = got {
            assert!(f.n <= MAX_N);
            assert!(f.batch.is_none_or(|b| (1..=MAX_BATCH).contains(&b)));
        }
    }
    let _ = ClassifyError {
        field: "x",
        expected: "y",
    }
    .to_string();
});

type Fields<'a> = HashMap<String, &'a RawValue>;

fn oracle(route: Route, f: &Fields) -> Result<RequestFacts, &'static str> {
    let get = |k: &str| non_null(f, k);
    let string = |k: &'static str| -> Result<Option<String>, &'static str> {
        match get(k) {
            None => Ok(None),
            Some(raw) => value_of(raw).as_str().map(|s| Some(s.to_owned())).ok_or(k),
        }
    };
    let boolean = |k: &'static str| -> Result<bool, &'static str> {
        match get(k) {
            None => Ok(false),
            Some(raw) => value_of(raw).as_bool().ok_or(k),
        }
    };
    let model = string("model")?;
    let stream = boolean("stream")?;
    let read_n = |raw: Option<Value>, field: &'static str| match raw {
        None => Ok(1),
        Some(v) => v.as_u64().filter(|n| (1..=1024).contains(n)).ok_or(field),
    };
    let mut n = read_n(get("n").map(value_of), "n")?;
    // `/generate` reads `n` from its `sampling_params` object (the top-level one is still checked).
    if route == Route::Generate {
        let sp_n = get("sampling_params")
            .map(value_of)
            .and_then(|sp| sp.get("n").cloned())
            .filter(|v| !v.is_null());
        n = read_n(sp_n, "sampling_params.n")?;
    }
    let batch: Option<(&'static str, usize)> = match route {
        Route::Generate => {
            if let Some(raw) = get("input_ids") {
                let els = elements(raw).ok_or("input_ids")?;
                if !els.is_empty() && els.iter().all(|e| lit(e) == Lit::Array) {
                    if !els.iter().all(|e| is_token_id_list(e)) {
                        return Err("input_ids");
                    }
                    Some(("input_ids", els.len()))
                } else if els.iter().all(|e| lit(e) == Lit::Integer) {
                    None
                } else {
                    return Err("input_ids");
                }
            } else if let Some(raw) = get("text") {
                match lit(raw) {
                    Lit::String => None,
                    Lit::Array => {
                        let els = elements(raw).expect("array");
                        if !els.iter().all(|e| lit(e) == Lit::String) {
                            return Err("text");
                        }
                        (!els.is_empty()).then_some(("text", els.len()))
                    }
                    _ => return Err("text"),
                }
            } else {
                None
            }
        }
        Route::Completions => match get("prompt") {
            None => None,
            Some(raw) => match lit(raw) {
                Lit::String => None,
                Lit::Array => {
                    let els = elements(raw).expect("array");
                    let all = |k| els.iter().all(|e| lit(e) == k);
                    if els.is_empty() || all(Lit::Integer) {
                        None
                    } else if all(Lit::String)
                        || (all(Lit::Array) && els.iter().all(|e| is_token_id_list(e)))
                    {
                        Some(("prompt", els.len()))
                    } else {
                        return Err("prompt");
                    }
                }
                _ => return Err("prompt"),
            },
        },
        Route::ChatCompletions => (n > 1).then_some(("n", n as usize)),
        _ => None,
    };
    if let Some((field, len)) = batch {
        if len > MAX_BATCH {
            return Err(field);
        }
    }
    let logprobs = match route {
        Route::Generate => boolean("return_logprob")?,
        Route::ChatCompletions => boolean("logprobs")?,
        Route::Completions => get("logprobs").is_some_and(|r| r != "false"),
        _ => false,
    };
    let request_id = match get("request_id") {
        Some(_) => string("request_id")?,
        None if route == Route::Generate => {
            get("rid").and_then(|r| value_of(r).as_str().map(str::to_owned))
        }
        None => None,
    };
    shape_oracle(route, f)?;
    Ok(RequestFacts {
        model,
        stream,
        n,
        batch: batch.map(|(_, l)| l),
        logprobs,
        request_id,
        max_tokens_field: oracle_cap(route, f),
    })
}

/// An array whose elements are all integer literals.
fn is_token_id_list(raw: &str) -> bool {
    elements(raw).is_some_and(|els| els.iter().all(|e| lit(e) == Lit::Integer))
}

fn oracle_cap(route: Route, f: &Fields) -> Option<&'static str> {
    let has = |k: &str| non_null(f, k).is_some();
    match route {
        Route::ChatCompletions if has("max_completion_tokens") => Some("max_completion_tokens"),
        Route::Responses => has("max_output_tokens").then_some("max_output_tokens"),
        _ => has("max_tokens").then_some("max_tokens"),
    }
}

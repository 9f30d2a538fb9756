//! `scan_object` + `rewrite` on arbitrary bytes.
//!
//! Properties: `scan_object` accepts exactly what `serde_json::Value` accepts and calls a valid
//! non-object `NotObject`; every entry's key is the unescaped key written at `key_start` and its
//! raw value parses to that key's value; `get` is last-duplicate-wins like serde_json; `rewrite`
//! with input-chosen drops and sets yields the expected object with each kept entry
//! byte-identical, in order and comma-separated right after `{`; a no-op rewrite keeps the
//! document's value; a rewrite with a mismatched (shorter) body never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::body::{rewrite, scan_object, BodyError};
use pdgate_filters_fuzz::{assert_rewritten, key_at, parse, parse_object, pick};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let reference = serde_json::from_slice::<Value>(data);
    let top = match (scan_object(data), &reference) {
        (Ok(top), Ok(Value::Object(_))) => top,
        (Err(BodyError::NotObject), Ok(v)) if !v.is_object() => return,
        (Err(BodyError::Syntax(_)), Err(_)) => return,
        (got, want) => panic!("scan_object {got:?} but serde_json {want:?}"),
    };
    let obj = parse_object(data, "scanned body");

    // Entries: every occurrence recorded, keys and values where they say they are.
    let mut keys: Vec<&str> = Vec::new();
    for e in top.entries() {
        assert_eq!(data[e.key_start], b'"', "key_start is not a quote");
        assert_eq!(
            key_at(data, e.key_start),
            e.key,
            "key_start points at another key"
        );
        let raw = &data[e.value.clone()];
        assert!(parse(raw).is_some(), "entry value is not one JSON value");
        assert_eq!(
            raw.trim_ascii(),
            raw,
            "entry value range includes whitespace"
        );
        keys.push(&e.key);
    }
    for (k, v) in &obj {
        assert!(top.contains(k), "key {k:?} missing from the entries");
        let raw = top.get(data, k).expect("get of a present key");
        assert_eq!(
            &parse(raw).expect("raw value"),
            v,
            "get({k:?}) is not the last duplicate"
        );
        assert_eq!(top.get_non_null(data, k).is_none(), v.is_null());
    }
    assert!(keys.iter().all(|k| obj.contains_key(*k)));

    // A no-op rewrite is the same document.
    let same = rewrite(data, &top, &[], &[]);
    assert_eq!(
        parse(&same),
        parse(data),
        "no-op rewrite changed the document"
    );

    // Drops and sets chosen by the input: an existing key, a new key, one with escapes.
    let pick_key = |salt| keys.get(pick(data, salt, keys.len() + 1)).copied();
    let drop: Vec<&str> = [pick_key(1), Some("bootstrap_room")]
        .into_iter()
        .flatten()
        .collect();
    let mut set: Vec<(&str, &[u8])> = vec![("n", b"1"), ("new\"key\u{1}\u{e9}", b"\"v\"")];
    if let Some(k) = pick_key(2).filter(|k| set.iter().all(|(s, _)| s != k)) {
        set.push((k, b"{\"x\":[true,null,-1.5e3]}"));
    }
    let out = rewrite(data, &top, &drop, &set);
    assert_rewritten(data, &top, &out, &drop, &set);
    // Kept entries come first, exactly as written, separated by single commas.
    let kept: Vec<&[u8]> = top
        .entries()
        .iter()
        .filter(|e| !drop.contains(&e.key.as_str()) && !set.iter().any(|(k, _)| *k == e.key))
        .map(|e| &data[e.key_start..e.value.end])
        .collect();
    let mut prefix = b"{".to_vec();
    prefix.extend(kept.join(&b","[..]));
    assert!(
        out.starts_with(&prefix),
        "kept entries are not spliced verbatim"
    );

    // A body that does not match the scan (the caller's bug) must not panic.
    let _ = rewrite(&data[..data.len() / 2], &top, &drop, &set);
});

//! `check_shape` (issue 12: bodies of the wrong shape never reach an engine) on every route.
//!
//! Properties: any bytes are accepted as a body exactly when serde_json reads them as an object
//! (the scan `check_shape` runs on), and then, for every route, `check_shape` never panics and
//! refuses exactly what an independent reading of the shape table refuses (`shape_oracle`),
//! naming the same field; `classify` never accepts a body `check_shape` refuses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::body::BodyError;
use pdgate_filters::classify::classify;
use pdgate_filters::shape::check_shape;
use pdgate_filters::{scan_object, Route};
use pdgate_filters_fuzz::{parse, raw_fields, shape_oracle};

fuzz_target!(|data: &[u8]| {
    let scanned = scan_object(data);
    match (&scanned, parse(data)) {
        (Ok(_), Some(v)) => assert!(v.is_object(), "scanned a non-object: {v}"),
        (Err(BodyError::NotObject), Some(v)) => assert!(!v.is_object(), "refused an object"),
        (Err(BodyError::Syntax(_)), None) => {}
        (got, want) => panic!("scan {got:?} vs serde_json {want:?}"),
    }
    let Ok(top) = scanned else { return };
    let fields = raw_fields(data).expect("a scanned object reads as a map");
    for route in Route::ALL {
        let got = check_shape(route, data, &top);
        match (&got, shape_oracle(route, &fields)) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(field)) => {
                assert_eq!(e.field, field, "{route:?}: {e}");
                assert!(e
                    .to_string()
                    .starts_with(&format!("field `{field}` must be ")));
            }
            (got, want) => panic!("{route:?}: check_shape {got:?}, expected {want:?}"),
        }
        if got.is_err() {
            assert!(classify(route, data, &top).is_err(), "{route:?}");
        }
    }
});

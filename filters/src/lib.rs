//! `pdgate-filters`: the pure, Pingora-free, I/O-free transforms on pdgate's hot path.
//!
//! Everything here takes bytes (client JSON, engine responses, SSE chunks) and returns bytes or
//! facts, never touches a socket, and never panics on hostile input: malformed input is an error
//! value. JSON is scanned once and rewritten by splicing raw byte ranges, so keys and values the
//! gateway does not touch reach the engine byte-for-byte and in the client's order.
//!
//! One home per fact: client field names live in [`fields`], handoff field names in
//! [`handoff`], error codes/statuses/messages in [`errors`].

pub mod ascii;
pub mod body;
pub mod classify;
pub mod errors;
pub mod fanout;
pub mod fields;
pub mod framing;
pub mod handoff;
pub mod json;
pub mod logprobs;
pub mod prehashed;
pub mod route;
pub mod routing_text;
pub mod shape;
pub mod sse;
pub mod usage;
pub mod value;

pub use body::{rewrite, scan_object, BodyError, Entry, TopLevel};
pub use classify::{classify, ClassifyError, RequestFacts};
pub use route::Route;

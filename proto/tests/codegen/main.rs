//! Tests of the generated code, in one binary so CI links tonic once: the wire contract against
//! the servicers' own stubs, and a client/server round trip on loopback.

mod round_trip;
mod stub_fields;

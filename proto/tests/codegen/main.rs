//! Tests of the generated code, in one binary so CI links tonic once.

mod round_trip;

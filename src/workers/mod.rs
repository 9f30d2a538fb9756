//! Workers: what is registered (registry), each worker's facts and live state, health checks,
//! and pair selection.

pub mod admission;
pub mod breaker;
pub mod canary;
pub mod encode;
pub mod facts;
pub mod grpc;
pub mod health;
pub mod intake;
pub mod links;
pub mod load;
pub mod pairing;
pub mod registry;
pub mod select;
pub mod worker;

pub use registry::{Registry, Snapshot};
pub use worker::{InFlight, Status, Worker, WorkerAddress};

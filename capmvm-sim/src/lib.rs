//! The capmvm simulation kit: everything needed to run the provider on one machine, with no Kubernetes
//! cluster and no flintlock hardware.
//!
//! - [`kube`]: an embedded Kubernetes API emulator (plain HTTP on loopback) that `kubectl`, kube-rs and
//!   the operator talk to as they would to a real API server.
//! - [`hosts`]: serving hollow flintlock hosts (the simulated flintlock of `capmvm-flintlock`).

pub mod bench;
pub mod capi;
pub mod demo;
pub mod hosts;
pub mod kube;
pub mod manifest;
pub mod soak;
pub mod world;

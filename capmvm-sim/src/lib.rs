//! The capmvm simulation kit: everything needed to run the provider on one machine, with no Kubernetes
//! cluster and no flintlock hardware.
//!
//! - [`kube`]: the embedded Kubernetes API emulator (plain HTTP on loopback) that `kubectl`, kube-rs and
//!   the operator talk to as they would to a real API server; the `capmvm-kube-emulator` crate, re-exported.
//! - [`hosts`]: serving hollow flintlock hosts (the simulated flintlock of `capmvm-flintlock`).

pub mod autoscale;
pub mod bench;
pub mod bench_pool;
pub mod bench_provider;
pub mod capi;
pub mod demo;
pub mod hosts;
pub mod manifest;
pub mod real;
pub mod soak;
pub mod stack;
pub mod watch_floor;
pub mod world;

pub use capmvm_kube_emulator as kube;

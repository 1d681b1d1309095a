//! A client for [flintlock](https://github.com/liquidmetal-dev/flintlock)'s gRPC API, and (feature
//! `hollow`) a hollow flintlock host that speaks the same protocol for tests, simulations and
//! benchmarks.
//!
//! - [`ClientPool`] keeps one gRPC channel per [`HostConfig`] (endpoint, TLS material, token, proxy)
//!   and hands out cheap [`FlintlockClient`]s on it.
//! - [`FlintlockClient`] makes the five calls with a per-call deadline and returns domain types
//!   ([`Microvm`], [`MicrovmSpec`], ...) or an [`Error`] whose [`ErrorKind`] callers branch on.
//! - Tokens and keys live in [`SecretString`]/[`SecretBytes`], which never print.
//!
//! The wire types generated from `proto/` are in [`proto`]; [`types`] is the one place converting
//! between them and the domain types.

pub mod client;
pub mod error;
#[cfg(feature = "hollow")]
pub mod hollow;
pub mod proto;
pub mod secret;
pub mod types;

pub use client::{
    CallObserver, ClientPool, FlintlockClient, HostConfig, Method, PoolOptions, TlsMaterial,
};
pub use error::{Error, ErrorKind};
pub use secret::{SecretBytes, SecretString};
pub use types::{
    IfaceType, Initrd, Kernel, Microvm, MicrovmSpec, MicrovmState, MicrovmStatus, Mount, MountType,
    NetworkInterface, NetworkInterfaceStatus, StaticAddress, Volume, VolumeSource, VolumeStatus,
};

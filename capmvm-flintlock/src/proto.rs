//! Code generated from `proto/` by `build.rs`: flintlock's messages and the tonic client and server.
//!
//! The module tree mirrors the proto packages because the generated code refers across packages with
//! relative paths (`super::super::...`). [`types`] and [`services`] are the short names to use.
#![allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]

/// Proto package `flintlock.*`.
pub mod flintlock {
    /// Proto package `flintlock.types`: the microVM messages.
    pub mod types {
        tonic::include_proto!("flintlock.types");
    }
}

/// Proto package `microvm.*`.
pub mod microvm {
    /// Proto package `microvm.services.*`.
    pub mod services {
        /// Proto package `microvm.services.api.*`.
        pub mod api {
            /// Proto package `microvm.services.api.v1alpha1`: the `MicroVM` service.
            pub mod v1alpha1 {
                tonic::include_proto!("microvm.services.api.v1alpha1");
            }
        }
    }
}

pub use flintlock::types;
pub use microvm::services::api::v1alpha1 as services;

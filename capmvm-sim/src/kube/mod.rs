//! The embedded Kubernetes API emulator.

//! `capmvm-sim hosts`: serves N hollow flintlock hosts on loopback until interrupted.
